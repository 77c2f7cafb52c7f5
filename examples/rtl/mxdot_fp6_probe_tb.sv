// mxdot_fp6_probe_tb: mxdot_fp6 (11 E3M2 elements) as a unit speaking mxsim probe's line protocol.
//
//   iverilog -g2012 -o mxdot_fp6_probe_tb.vvp [-P mxdot_fp6_probe_tb.BUG=n] mxdot_fp6.sv mxdot_fp6_probe_tb.sv
//   mxsim probe --command 'vvp -n mxdot_fp6_probe_tb.vvp' --a-format fp6_e3m2 --b-format fp6_e3m2 --k 11 --out unit.yaml
//
// Each request line is "A B SA SB C" in hexadecimal (A and B: 17 digits, element i in bits
// [6i+5:6i]); each answer is d, 8 hexadecimal digits. The simulation ends at the end of its input.
`timescale 1ns / 1ps
module mxdot_fp6_probe_tb;
  parameter int BUG = 0;
  localparam int STDIN = 32'h8000_0000;

  logic [65:0] a, b;
  logic [7:0] scale_a, scale_b;
  logic [31:0] c, d;
  int fields;

  mxdot_fp6 #(.BUG(BUG)) dut (
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
