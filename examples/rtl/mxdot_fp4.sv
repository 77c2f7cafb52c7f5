// mxdot_fp4: MXFP4 dot product, ocp-exact semantics. Combinational, synthesizable.
//
//   d = RNE_fp32( c + 2^(Xa-127) * 2^(Xb-127) * sum_{i<32} a_i * b_i )
//
// a, b: 32 fp4_e2m1 element codes each (element i at [4i+3:4i]); scale_a, scale_b: E8M0
// codes of the one block (k = K = 32); c, d: FP32 bits.
// * products and their sum exact; c added exactly; one rounding, to nearest, ties to even;
// * subnormal results kept; results at or past 2^128 (after rounding) are +-Inf;
// * NaN scale (0xFF) or NaN c -> quiet NaN 0x7FC00000; c = +-Inf -> c (the block is finite);
// * an exact zero is -0 only if every addend (the 32 products and c) is -0.
//
// Datapath: all terms go onto one signed fixed-point grid, LSB 2^-153, 300 bits.
// * Block sum S: integer in units of 2^-2 (fp4 values are multiples of 2^-1), |S| <= 4608 < 2^13.
//   Its value is S * 2^(Xa+Xb-256).
// * c: FP32, a multiple of 2^-149 below 2^128, exactly on the grid (shift <= 257, < 2^281).
// * If S != 0 and Xa+Xb-256 >= 130, |block| >= 2^130 > 2|c|, so the sum has S's sign and
//   magnitude >= 2^129: +-Inf without computing it (flag block_huge). Otherwise the block is
//   below 2^142 and fits the grid (< 2^295 LSBs).
// * Block bits below 2^-152 are cut off, and a sticky bit at 2^-153 records whether any was
//   set (magnitude truncated, sign applied afterwards). This is exact for rounding: FP32
//   rounding points (values and midpoints) are multiples of 2^-150, c has no bits below
//   2^-149, so the exact sum v and the grid sum v' lie strictly between the same two
//   multiples of 2^-152 (or both on the same one, when nothing was cut) and round alike; v'
//   is zero only when v is.
// * |sum| < 2^296: leading-one position p, rounding LSB at max(p-23, 4) (bit 4 = 2^-149,
//   the subnormal spacing), round bit below it, sticky below that.
//
// BUG selects a deliberately broken variant, to show the golden vectors catch it:
//   0 correct          1 truncates instead of rounding       2 rounding ignores the sticky bit
//   3 drops the alignment sticky of the block term           4 flushes subnormal results to zero
//   5 exact zeros always +0                                  6 overflow saturates to max finite
//   7 subnormal elements (+-0.5) read as zero
`timescale 1ns / 1ps
module mxdot_fp4 #(
    parameter int BUG = 0
) (
    input  logic [127:0] a,
    input  logic [127:0] b,
    input  logic [7:0]   scale_a,
    input  logic [7:0]   scale_b,
    input  logic [31:0]  c,
    output logic [31:0]  d
);
  localparam int K = 32;
  localparam int W = 300;  // grid bits, two's complement; LSB 2^-153

  // Each stage is a function of its inputs, wired with continuous assignments.

  // fp4_e2m1 magnitude (exponent 2 bits, bias 1; mantissa 1 bit) in units of 2^-1.
  function automatic logic [3:0] fp4_magnitude(input logic [2:0] code);
    if (code[2:1] == 2'd0) fp4_magnitude = (BUG == 7) ? 4'd0 : {3'b000, code[0]};  // subnormal: 0 or 0.5
    else fp4_magnitude = {2'b00, 1'b1, code[0]} << (code[2:1] - 2'd1);  // (2+m) * 2^(e-1)
  endfunction

  // {all products -0, S}: S = sum of the 32 exact products in units of 2^-2 (|S| <= 4608).
  function automatic logic [16:0] lane_sum(input logic [127:0] a_codes, input logic [127:0] b_codes);
    logic [15:0] sum;
    logic all_negative_zero;
    logic [7:0] product;
    logic sign;
    sum = 16'd0;
    all_negative_zero = 1'b1;
    for (int lane = 0; lane < K; lane++) begin
      product = fp4_magnitude(a_codes[4*lane+:3]) * fp4_magnitude(b_codes[4*lane+:3]);
      sign = a_codes[4*lane+3] ^ b_codes[4*lane+3];
      sum = sign ? sum - {8'd0, product} : sum + {8'd0, product};
      all_negative_zero = all_negative_zero & (product == 8'd0) & sign;
    end
    lane_sum = {all_negative_zero, sum};
  endfunction

  // |block| on the grid: |S| * 2^(scale_sum - 103) LSBs, or below 2^-152 cut with a sticky bit.
  function automatic logic [W-1:0] block_on_grid(input logic [12:0] magnitude, input logic [8:0] scale_sum);
    logic [6:0] cut;
    logic [12:0] kept;
    logic sticky;
    if (scale_sum >= 9'd103) begin
      block_on_grid = {{(W - 13) {1'b0}}, magnitude} << (scale_sum - 9'd103);
    end else begin
      cut = 7'd104 - scale_sum[6:0];  // 2..104 bits below 2^-152
      kept = (cut >= 7'd13) ? 13'd0 : magnitude >> cut;
      sticky = (cut >= 7'd13) ? (magnitude != 13'd0) : ((magnitude & ((13'd1 << cut) - 13'd1)) != 13'd0);
      if (BUG == 3) sticky = 1'b0;
      block_on_grid = {{(W - 14) {1'b0}}, kept, sticky};
    end
  endfunction

  // |c| on the grid: M * 2^(max(e,1) - 150) = M << (max(e,1) + 3) LSBs (zero for Inf/NaN).
  function automatic logic [W-1:0] c_on_grid(input logic [31:0] value);
    logic [23:0] significand;
    logic [8:0] shift;
    significand = {value[30:23] != 8'd0, value[22:0]};
    shift = ((value[30:23] == 8'd0) ? 9'd1 : {1'b0, value[30:23]}) + 9'd3;
    c_on_grid = (value[30:23] == 8'hFF) ? '0 : ({{(W - 24) {1'b0}}, significand} << shift);
  endfunction

  // FP32 exponent and fraction fields of a nonzero grid magnitude rounded to nearest even,
  // 40 bits wide so that overflow (>= 0x7F800000) stays visible.
  function automatic logic [39:0] round_fields(input logic [W-1:0] magnitude);
    logic [W-1:0] one;
    int leading, round_lsb;
    logic [24:0] significand;
    logic round_bit, sticky, increment;
    one = {{(W - 1) {1'b0}}, 1'b1};
    leading = 0;
    for (int i = 0; i < W; i++) if (magnitude[i]) leading = i;
    round_lsb = (leading >= 27) ? leading - 23 : 4;  // normal: keep 24 bits; subnormal: 2^-149
    significand = {1'b0, 24'(magnitude >> round_lsb)};
    round_bit = magnitude[round_lsb-1];
    sticky = (magnitude & ((one << (round_lsb - 1)) - one)) != '0;
    case (BUG)
      1: increment = 1'b0;
      2: increment = round_bit & significand[0];
      default: increment = round_bit & (sticky | significand[0]);
    endcase
    significand = significand + {24'd0, increment};
    // Normal: fields = ((leading - 26) << 23) + (significand - 2^23) = ((leading - 27) << 23) + significand,
    // so a carry to 2^24 steps the exponent. Subnormal: the fields are the significand.
    round_fields = {15'd0, significand} + ((leading >= 27) ? (40'(leading - 27) << 23) : 40'd0);
    if (BUG == 4 && leading < 27) round_fields = 40'd0;
  endfunction

  // ---- wiring ----
  logic        all_products_negative_zero;
  logic [15:0] block_sum;
  logic        block_negative, block_huge, scale_nan, c_nan, c_inf, zero_sign;
  logic [12:0] block_magnitude;
  logic [8:0]  scale_sum;
  logic [W-1:0] block_term, c_term, total, magnitude;
  logic        result_negative;
  logic [39:0] fields;

  assign {all_products_negative_zero, block_sum} = lane_sum(a, b);
  assign block_negative = block_sum[15];
  assign block_magnitude = block_negative ? 13'(-block_sum) : block_sum[12:0];
  assign scale_sum = {1'b0, scale_a} + {1'b0, scale_b};
  assign scale_nan = (scale_a == 8'hFF) || (scale_b == 8'hFF);
  assign block_huge = (block_magnitude != 13'd0) && (scale_sum >= 9'd386);  // |block| >= 2^130
  assign block_term = block_huge ? '0 : block_on_grid(block_magnitude, scale_sum);
  assign c_nan = (c[30:23] == 8'hFF) && (c[22:0] != 23'd0);
  assign c_inf = (c[30:23] == 8'hFF) && (c[22:0] == 23'd0);
  assign c_term = c_on_grid(c);
  assign total = (block_negative ? -block_term : block_term) + (c[31] ? -c_term : c_term);
  assign result_negative = total[W-1];
  assign magnitude = result_negative ? -total : total;
  assign fields = round_fields(magnitude);
  assign zero_sign = (BUG == 5) ? 1'b0 : all_products_negative_zero & (c == 32'h8000_0000);

  localparam logic [30:0] OVERFLOW = (BUG == 6) ? 31'h7F7F_FFFF : 31'h7F80_0000;
  assign d = (scale_nan || c_nan) ? 32'h7FC0_0000
           : c_inf ? c
           : block_huge ? {block_negative, OVERFLOW}
           : (magnitude == '0) ? {zero_sign, 31'd0}
           : (fields >= 40'h7F80_0000) ? {result_negative, OVERFLOW}
           : {result_negative, fields[30:0]};
endmodule
