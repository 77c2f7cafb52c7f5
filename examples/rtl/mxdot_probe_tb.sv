// mxdot_probe_tb: mxdot_fp4 as a unit speaking mxsim probe's line protocol (docs/probe.md).
//
//   iverilog -g2012 -o mxdot_probe_tb.vvp [-P mxdot_probe_tb.BUG=n] mxdot_fp4.sv mxdot_probe_tb.sv
//   mxsim probe --command 'vvp -n mxdot_probe_tb.vvp' --a-format fp4_e2m1 --b-format fp4_e2m1 --k 32 --out unit.yaml
//
// Each request line on stdin is "A B SA SB C" in hexadecimal: A and B the 32 fp4 codes
// (element i in bits [4i+3:4i], as the unit's ports), SA and SB the block's E8M0 scales, C
// the fp32 bits of c. Each answer is one line on stdout: d, 8 hexadecimal digits. The
// simulation ends at the end of its input (or at a line it cannot read).
`timescale 1ns / 1ps
module mxdot_probe_tb;
  parameter int BUG = 0;
  localparam int STDIN = 32'h8000_0000;

  logic [127:0] a, b;
  logic [7:0] scale_a, scale_b;
  logic [31:0] c, d;
  int fields;

  mxdot_fp4 #(.BUG(BUG)) dut (
      .a(a), .b(b), .scale_a(scale_a), .scale_b(scale_b), .c(c), .d(d)
  );

  initial begin
    forever begin
      fields = $fscanf(STDIN, "%h %h %h %h %h", a, b, scale_a, scale_b, c);
      if (fields != 5) $finish;
      #1;
      $display("%h", d);
      $fflush();
    end
  end
endmodule
