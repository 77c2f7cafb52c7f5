// mxdot_fp6: one MXFP6 (E3M2) dot-product operation of 11 elements, ocp-exact semantics.
// Combinational, synthesizable. The width of an operation of a unit taking 64 bits plus a
// 2-bit extension per operand (66 bits: 11 FP6 codes), probed by tests/test_probe_rtl.py.
//
//   d = RNE_fp32( c + 2^(Xa-127) * 2^(Xb-127) * sum_{i<11} a_i * b_i )
//
// a, b: 11 fp6_e3m2 element codes each (element i at [6i+5:6i]); scale_a, scale_b: E8M0
// codes (one per operand); c, d: FP32 bits. Rounding, specials and zero signs as mxdot_fp4.sv.
//
// Datapath: as mxdot_fp4.sv, one signed fixed-point grid, LSB 2^-153, 310 bits.
// * E3M2 magnitudes are multiples of 2^-4 below 2^5 (at most 448 units, 9 bits); a product
//   is a multiple of 2^-8 (at most 200,704 units) and the block sum S of 11 products is an
//   integer in units of 2^-8, |S| < 2^22. Its value is S * 2^(Xa+Xb-262).
// * If S != 0 and Xa+Xb-262 >= 130, the sum is +-Inf (flag block_huge); otherwise the block
//   is below 2^152 and fits the grid (< 2^305 LSBs).
// * Block bits below 2^-152 are cut with a sticky bit at 2^-153 (exact for rounding, as in
//   mxdot_fp4.sv).
//
// BUG selects a deliberately broken variant:
//   0 correct      1 truncates instead of rounding      2 the eleventh element is ignored
`timescale 1ns / 1ps
module mxdot_fp6 #(
    parameter int BUG = 0
) (
    input  logic [65:0] a,
    input  logic [65:0] b,
    input  logic [7:0]  scale_a,
    input  logic [7:0]  scale_b,
    input  logic [31:0] c,
    output logic [31:0] d
);
  localparam int K = 11;
  localparam int W = 310;  // grid bits, two's complement; LSB 2^-153

  // fp6_e3m2 magnitude (exponent 3 bits, bias 3; mantissa 2 bits) in units of 2^-4.
  function automatic logic [8:0] fp6_magnitude(input logic [4:0] code);
    if (code[4:2] == 3'd0) fp6_magnitude = {7'd0, code[1:0]};                      // subnormal: m * 2^-4
    else fp6_magnitude = {6'd0, 1'b1, code[1:0]} << (code[4:2] - 3'd1);            // (4+m) * 2^(e-1) units
  endfunction

  // {all products -0, S}: S = sum of the 11 exact products in units of 2^-8.
  function automatic logic [23:0] lane_sum(input logic [65:0] a_codes, input logic [65:0] b_codes);
    logic [22:0] sum;
    logic all_negative_zero;
    logic [17:0] product;
    logic sign;
    sum = 23'd0;
    all_negative_zero = 1'b1;
    for (int lane = 0; lane < K; lane++) begin
      product = fp6_magnitude(a_codes[6*lane+:5]) * fp6_magnitude(b_codes[6*lane+:5]);
      if (BUG == 2 && lane == K - 1) product = 18'd0;
      sign = a_codes[6*lane+5] ^ b_codes[6*lane+5];
      sum = sign ? sum - {5'd0, product} : sum + {5'd0, product};
      all_negative_zero = all_negative_zero & (product == 18'd0) & sign;
    end
    lane_sum = {all_negative_zero, sum};
  endfunction

  // |block| on the grid: |S| * 2^(scale_sum - 109) LSBs, or below 2^-152 cut with a sticky bit.
  function automatic logic [W-1:0] block_on_grid(input logic [21:0] magnitude, input logic [8:0] scale_sum);
    logic [6:0] cut;
    logic [21:0] kept;
    logic sticky;
    if (scale_sum >= 9'd109) begin
      block_on_grid = {{(W - 22) {1'b0}}, magnitude} << (scale_sum - 9'd109);
    end else begin
      cut = 7'd110 - scale_sum[6:0];  // 2..110 bits below 2^-152
      kept = (cut >= 7'd22) ? 22'd0 : magnitude >> cut;
      sticky = (cut >= 7'd22) ? (magnitude != 22'd0) : ((magnitude & ((22'd1 << cut) - 22'd1)) != 22'd0);
      block_on_grid = {{(W - 23) {1'b0}}, kept, sticky};
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
    increment = (BUG == 1) ? 1'b0 : round_bit & (sticky | significand[0]);
    significand = significand + {24'd0, increment};
    round_fields = {15'd0, significand} + ((leading >= 27) ? (40'(leading - 27) << 23) : 40'd0);
  endfunction

  // ---- wiring ----
  logic        all_products_negative_zero;
  logic [22:0] block_sum;
  logic        block_negative, block_huge, scale_nan, c_nan, c_inf, zero_sign;
  logic [21:0] block_magnitude;
  logic [8:0]  scale_sum;
  logic [W-1:0] block_term, c_term, total, magnitude;
  logic        result_negative;
  logic [39:0] fields;

  assign {all_products_negative_zero, block_sum} = lane_sum(a, b);
  assign block_negative = block_sum[22];
  assign block_magnitude = block_negative ? 22'(-block_sum) : block_sum[21:0];
  assign scale_sum = {1'b0, scale_a} + {1'b0, scale_b};
  assign scale_nan = (scale_a == 8'hFF) || (scale_b == 8'hFF);
  assign block_huge = (block_magnitude != 22'd0) && (scale_sum >= 9'd392);  // |block| >= 2^130
  assign block_term = block_huge ? '0 : block_on_grid(block_magnitude, scale_sum);
  assign c_nan = (c[30:23] == 8'hFF) && (c[22:0] != 23'd0);
  assign c_inf = (c[30:23] == 8'hFF) && (c[22:0] == 23'd0);
  assign c_term = c_on_grid(c);
  assign total = (block_negative ? -block_term : block_term) + (c[31] ? -c_term : c_term);
  assign result_negative = total[W-1];
  assign magnitude = result_negative ? -total : total;
  assign fields = round_fields(magnitude);
  assign zero_sign = all_products_negative_zero & (c == 32'h8000_0000);

  assign d = (scale_nan || c_nan) ? 32'h7FC0_0000
           : c_inf ? c
           : block_huge ? {block_negative, 31'h7F80_0000}
           : (magnitude == '0) ? {zero_sign, 31'd0}
           : (fields >= 40'h7F80_0000) ? {result_negative, 31'h7F80_0000}
           : {result_negative, fields[30:0]};
endmodule
