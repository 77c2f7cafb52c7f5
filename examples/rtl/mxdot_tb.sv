// mxdot_tb: runs mxsim golden vectors through mxdot_fp4 and compares every output bit.
//
//   iverilog -g2012 -o mxdot_tb.vvp [-P mxdot_tb.BUG=n] mxdot_fp4.sv mxdot_tb.sv
//   vvp mxdot_tb.vvp +vectors=ocp-exact.fp4_e2m1xfp4_e2m1.corners.hex [+show=20]
//
// The vector file (mxsim golden, fp4 x fp4, K = k = 32, fp32 out) holds one 336-bit word per
// line, fields most significant first: a[335:208] b[207:80] scale_a[79:72] scale_b[71:64]
// c[63:32] d[31:0] (see the file's '// field' header). Prints "N passed, M failed" and ends
// with $fatal on any mismatch (or when no vector was read).
`timescale 1ns / 1ps
module mxdot_tb;
  parameter int BUG = 0;
  parameter int MAX_VECTORS = 65536;
  localparam int WORD = 336;

  logic [WORD-1:0] vectors[0:MAX_VECTORS-1];
  logic [127:0] a, b;
  logic [7:0] scale_a, scale_b;
  logic [31:0] c, expected, d;

  mxdot_fp4 #(.BUG(BUG)) dut (
      .a(a), .b(b), .scale_a(scale_a), .scale_b(scale_b), .c(c), .d(d)
  );

  string path;
  int show, passed, failed, index, expected_count;
  logic done;
  initial begin
    if (!$value$plusargs("vectors=%s", path)) $fatal(1, "mxdot_tb: give +vectors=FILE");
    if (!$value$plusargs("show=%d", show)) show = 10;
    if (!$value$plusargs("count=%d", expected_count)) expected_count = -1;
    $readmemh(path, vectors);
    passed = 0;
    failed = 0;
    index = 0;
    done = 1'b0;
    while (!done) begin
      if (index == MAX_VECTORS || ^vectors[index] === 1'bx) begin
        done = 1'b1;  // past the last line read
      end else begin
        {a, b, scale_a, scale_b, c, expected} = vectors[index];
        #1;
        if (d === expected) passed = passed + 1;
        else begin
          failed = failed + 1;
          if (failed <= show)
            $display("FAIL %0d: a=%h b=%h scale_a=%h scale_b=%h c=%h: got %h, expected %h",
                     index, a, b, scale_a, scale_b, c, d, expected);
        end
        index = index + 1;
      end
    end
    $display("%0d passed, %0d failed", passed, failed);
    if (expected_count >= 0 && passed + failed != expected_count)
      $fatal(1, "mxdot_tb: read %0d vectors, expected %0d", passed + failed, expected_count);
    if (failed != 0 || passed == 0) $fatal(1, "mxdot_tb: %0d of %0d vectors failed", failed, passed + failed);
    $finish;
  end
endmodule
