// mxdot_dpi_tb: a live scoreboard for mxdot_fp4. Constrained-random stimulus drives the unit, and
// every result is checked against the unit's exported C model, called over DPI-C (mxsim export c
// --hw hwconfigs/ocp-exact.yaml --a-format fp4_e2m1 --b-format fp4_e2m1 --out DIR: the model and
// the import "DPI-C" lines below come from there). The first mismatch prints the operands, both
// results and the model's stage values, and ends the run with $fatal.
//
// One build holds the good unit and its broken variants (parameter BUG of mxdot_fp4.sv, 0..7);
// +bug=n picks the one checked, +count=n the vectors, +verilator+seed+s the stimulus.
//
//   make dpi [BUG=n] [COUNT=n]      (Verilator; docs/cmodel.md for other simulators)
`timescale 1ns / 1ps
`include "mxc_ocp_exact_fp4_e2m1_fp4_e2m1_dpi.svh"
module mxdot_dpi_tb;
  localparam int K = 32;
  localparam int VARIANTS = 8;

  logic [127:0] a, b;
  logic [7:0] scale_a, scale_b;
  logic [31:0] c, d;
  logic [31:0] variant_d[VARIANTS];
  bit [31:0] expected;
  int bug;

  for (genvar n = 0; n < VARIANTS; n++) begin : variant
    mxdot_fp4 #(.BUG(n)) dut (.a(a), .b(b), .scale_a(scale_a), .scale_b(scale_b), .c(c), .d(variant_d[n]));
  end
  assign d = variant_d[bug];

  // One fp4_e2m1 code: weighted toward zeros, subnormals (+-0.5) and the largest value (+-6).
  function automatic logic [3:0] element();
    int pick = $urandom_range(99);
    logic sign = 1'($urandom_range(1));
    if (pick < 15) return {sign, 3'd0};
    if (pick < 35) return {sign, 3'd1};
    if (pick < 45) return {sign, 3'd7};
    return 4'($urandom_range(15));
  endfunction

  // An E8M0 scale: near 1 mostly, the ends of the range and NaN (0xFF) sometimes.
  function automatic logic [7:0] scale();
    int pick = $urandom_range(99);
    if (pick < 70) return 8'(127 + $urandom_range(12) - 6);
    if (pick < 78) return 8'($urandom_range(3));
    if (pick < 86) return 8'(254 - $urandom_range(3));
    if (pick < 88) return 8'hFF;
    return 8'($urandom_range(254));
  endfunction

  // c: +-0, a value near the block's magnitude, subnormal, huge, +-Inf, NaN or any bits.
  function automatic logic [31:0] accumulator(input logic [7:0] sa, input logic [7:0] sb);
    int pick = $urandom_range(99);
    logic sign = 1'($urandom_range(1));
    int exponent = int'(sa) + int'(sb) - 127 + $urandom_range(8) - 2;
    if (pick < 20) return {sign, 31'd0};
    if (pick < 60 && exponent > 0 && exponent < 255) return {sign, 8'(exponent), 23'($urandom)};
    if (pick < 70) return {sign, 8'd0, 23'($urandom)};
    if (pick < 75) return {sign, 8'd254, 23'($urandom)};
    if (pick < 78) return {sign, 8'hFF, 23'd0};
    if (pick < 80) return 32'h7FC0_0000;
    return $urandom;
  endfunction

  int count, passed;
  logic [127:0] next_a, next_b;
  initial begin
    if (!$value$plusargs("count=%d", count)) count = 20000;
    if (!$value$plusargs("bug=%d", bug)) bug = 0;
    if (bug < 0 || bug >= VARIANTS) $fatal(1, "mxdot_dpi_tb: +bug=%0d: expected 0..%0d", bug, VARIANTS - 1);
    passed = 0;
    for (int n = 0; n < count; n++) begin
      for (int i = 0; i < K; i++) begin
        next_a[4*i+:4] = element();
        next_b[4*i+:4] = element();
      end
      scale_a = scale();
      scale_b = scale();
      c = accumulator(scale_a, scale_b);
      if ($urandom_range(99) < 3) begin  // every product -0 and c = -0: the sum of zeros is -0
        for (int i = 0; i < K; i++) begin
          next_a[4*i+:4] = {1'($urandom_range(1)), 3'd0};
          next_b[4*i+:4] = {~next_a[4*i+3], 3'($urandom_range(7))};
        end
        c = 32'h8000_0000;
      end
      a = next_a;  // whole buses at once: the unit sees one change per operand
      b = next_b;
      #1;
      mxc_ocp_exact_fp4_e2m1_fp4_e2m1_dpi(a, b, scale_a, scale_b, c, expected);
      if (d !== expected) begin
        $display("MISMATCH (BUG=%0d) %0d: a=%h b=%h scale_a=%h scale_b=%h c=%h: unit %h, C model %h", bug, n, a, b, scale_a, scale_b,
                 c, d, expected);
        mxc_ocp_exact_fp4_e2m1_fp4_e2m1_dpi_print_stages(a, b, scale_a, scale_b, c);
        $fatal(1, "mxdot_dpi_tb: mismatch after %0d passed", passed);
      end
      passed++;
    end
    $display("BUG=%0d: %0d passed, 0 failed", bug, passed);
    $finish;
  end
endmodule
