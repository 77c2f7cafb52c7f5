// mxsim_rtl_lib.sv: the generic stages of the dot-product units `mxsim rtl` generates.
//
// Every module is combinational and parameterised by data the generator takes from the
// hardware config (widths, the window F, rounding modes): no module knows a config by name.
// Conventions shared by all modules:
//   * an exponent bus is a signed EXW-bit integer;
//   * a magnitude `mag` with least-significant-bit exponent `lsb` is the value mag * 2^lsb;
//   * rounding modes: 0 nearest_even, 1 nearest_away, 2 toward_zero, 3 toward_positive,
//     4 toward_negative, 5 nearest_toward_positive (ties toward +inf);
//   * a format code is IEEE-754 shaped: sign, EB exponent bits (bias 2^(EB-1)-1), MB mantissa
//     bits, all-ones exponent for Inf (mantissa 0) and NaN.
// Synthesizable subset of IEEE 1800-2017 accepted by Icarus, Verilator and Yosys. Each stage
// is a function of its inputs (an automatic function behind a continuous assignment), so no
// always block re-triggers on its own intermediate values in an event-driven simulator.

// The position of the most significant set bit of x (0 when x is 0).
module mxr_msb #(parameter int W = 8, parameter int PW = 8) (
    input  logic [W-1:0]  x,
    output logic [PW-1:0] pos
);
  function automatic logic [PW-1:0] msb(input logic [W-1:0] value);
    msb = '0;
    for (int i = 0; i < W; i++) if (value[i]) msb = PW'(i);
  endfunction
  assign pos = msb(x);
endmodule

// An IEEE-shaped code unpacked: class flags, sign, alignment exponent max(floor(log2|v|), emin)
// and significand with its hidden bit, v = sig * 2^(exp - MB) for finite v.
module mxr_unpack #(parameter int EB = 8, parameter int MB = 23, parameter int EXW = 16) (
    input  logic [EB+MB:0]        code,
    output logic                  nan,
    output logic                  inf,
    output logic                  zero,
    output logic                  sign,
    output logic signed [EXW-1:0] exp,
    output logic [MB:0]           sig
);
  localparam int BIAS = (1 << (EB - 1)) - 1;
  logic [EB-1:0] field;
  assign sign = code[EB+MB];
  assign field = code[EB+MB-1:MB];
  assign nan = (&field) && (code[MB-1:0] != '0);
  assign inf = (&field) && (code[MB-1:0] == '0);
  assign zero = (field == '0) && (code[MB-1:0] == '0);
  assign exp = (field == '0) ? EXW'(1 - BIAS) : EXW'($signed({1'b0, field})) - EXW'(BIAS);
  assign sig = {field != '0, code[MB-1:0]};
endmodule

// Round sign * mag * 2^lsb into an IEEE-shaped format with rounding MODE.
//   SUBN 0: a result below the smallest normal flushes to zero (its sign kept), after rounding
//           on the subnormal grid;
//   OVF_INF 1: every overflow gives +-Inf; 0: IEEE (the largest finite value under a directed
//           mode rounding toward zero for that sign).
// mag = 0 gives a zero of sign `sign`; a nonzero value rounding to zero keeps its sign.
// `ovf` is set when a finite value became +-Inf.
module mxr_round #(
    parameter int W = 32, parameter int EB = 8, parameter int MB = 23, parameter int MODE = 0,
    parameter int SUBN = 1, parameter int OVF_INF = 0, parameter int EXW = 16
) (
    input  logic                  sign,
    input  logic [W-1:0]          mag,
    input  logic signed [EXW-1:0] lsb,
    output logic [EB+MB:0]        code,
    output logic                  ovf
);
  localparam int BIAS = (1 << (EB - 1)) - 1;
  localparam int EMIN = 1 - BIAS;
  localparam int EMAX = BIAS;
  localparam int PW = $clog2(W + 1) + 1;
  localparam int TW = W + MB + 2;  // mag shifted left by up to MB + 1 places
  logic [PW-1:0] top;
  mxr_msb #(.W(W), .PW(PW)) msb_i (.x(mag), .pos(top));

  function automatic logic [EB+MB+1:0] round(input logic s, input logic [W-1:0] m, input logic signed [EXW-1:0] l,
                                             input logic [PW-1:0] t);
    logic signed [EXW-1:0] lead, target, shift, result_exp;
    logic [TW-1:0] wide, kept_w;
    logic [MB+1:0] kept, rounded;
    logic guard, sticky, increment, carry, overflow, to_infinity;
    logic [EB-1:0] field;
    logic [MB-1:0] fraction;
    lead = l + EXW'($signed({1'b0, t}));
    target = (lead - EXW'(MB) > EXW'(EMIN - MB)) ? lead - EXW'(MB) : EXW'(EMIN - MB);
    shift = target - l;  // places m moves right; negative: it moves left (exactly)
    wide = TW'(m);
    guard = 1'b0;
    sticky = 1'b0;
    if (shift <= 0) begin
      kept_w = wide << (-shift);
    end else if (shift > EXW'(W)) begin
      kept_w = '0;
      sticky = m != '0;
    end else begin
      kept_w = wide >> shift;
      guard = wide[shift - 1];
      sticky = (wide & ((TW'(1) << (shift - 1)) - TW'(1))) != '0;
    end
    kept = kept_w[MB+1:0];
    case (MODE)
      0: increment = guard && (sticky || kept[0]);
      1: increment = guard;
      2: increment = 1'b0;
      3: increment = !s && (guard || sticky);
      4: increment = s && (guard || sticky);
      default: increment = guard && (sticky || !s);
    endcase
    rounded = kept + (MB+2)'(increment);
    carry = rounded[MB+1];
    result_exp = target + EXW'(MB) + (carry ? EXW'(1) : EXW'(0));
    overflow = (rounded != '0) && (result_exp > EXW'(EMAX));
    case (MODE)
      2: to_infinity = OVF_INF != 0;
      3: to_infinity = (OVF_INF != 0) || !s;
      4: to_infinity = (OVF_INF != 0) || s;
      default: to_infinity = 1'b1;
    endcase
    if (overflow) begin
      field = to_infinity ? '1 : {{(EB-1){1'b1}}, 1'b0};
      fraction = to_infinity ? '0 : '1;
    end else if (carry) begin
      field = EB'(result_exp + EXW'(BIAS));
      fraction = rounded[MB:1];
    end else if (rounded[MB]) begin
      field = EB'(result_exp + EXW'(BIAS));
      fraction = rounded[MB-1:0];
    end else begin  // subnormal or zero
      field = '0;
      fraction = (SUBN != 0) ? rounded[MB-1:0] : '0;
    end
    round = {overflow && to_infinity, s, field, fraction};
  endfunction
  assign {ovf, code} = round(sign, mag, lsb, top);
endmodule

// One term brought into an adder window whose LSB has exponent `wlsb`: sign * sig * 2^lsb kept
// to multiples of 2^wlsb as MODE says (0 truncate: magnitude toward zero; 1 floor: toward -inf;
// 2 nearest_even; 3 sticky: truncate and jam a bit half an LSB below, the output then counting
// half LSBs). The caller guarantees lsb - wlsb <= LMAX (the term never needs more left shift)
// and that the kept magnitude fits WO - 1 bits. `out` is two's complement.
module mxr_window_term #(
    parameter int WI = 8, parameter int LMAX = 0, parameter int WO = 16, parameter int MODE = 0,
    parameter int EXW = 16
) (
    input  logic                  sign,
    input  logic [WI-1:0]         sig,
    input  logic signed [EXW-1:0] lsb,
    input  logic signed [EXW-1:0] wlsb,
    output logic signed [WO-1:0]  out
);
  localparam int TW = WI + LMAX + 1;
  function automatic logic [WO-1:0] align(input logic s, input logic [WI-1:0] m, input logic signed [EXW-1:0] l,
                                          input logic signed [EXW-1:0] w);
    logic signed [EXW-1:0] shift;  // right shift of m << LMAX
    logic [TW-1:0] wide, kept;
    logic guard, dropped, below_guard, up;
    logic [WO-1:0] magnitude;
    shift = w - l + EXW'(LMAX);
    wide = TW'(m) << LMAX;
    guard = 1'b0;
    below_guard = 1'b0;
    if (shift <= 0) begin
      kept = wide;
      dropped = 1'b0;
    end else if (shift > EXW'(TW)) begin
      kept = '0;
      dropped = m != '0;
    end else begin
      kept = wide >> shift;
      guard = wide[shift - 1];
      dropped = (wide & ((TW'(1) << shift) - TW'(1))) != '0;
      below_guard = (wide & ((TW'(1) << (shift - 1)) - TW'(1))) != '0;
    end
    case (MODE)
      1: up = s && dropped;
      2: up = guard && (below_guard || kept[0]);
      default: up = 1'b0;
    endcase
    if (MODE == 3) magnitude = {WO'(kept), 1'b0} | WO'(dropped);
    else magnitude = WO'(kept) + WO'(up);
    align = s ? -magnitude : magnitude;
  endfunction
  assign out = align(sign, sig, lsb, wlsb);
endmodule

// x + y rounded once into an IEEE-shaped format, x a two's complement integer at exponent
// lsb_x, y = sign_y * mag_y * 2^lsb_y. Both are aligned below the larger leading bit R in a
// window of F = max(WX, WY, MB + 1) + 3 places, what falls below jammed into a sticky bit:
// exact for every rounding mode (the smaller term loses bits only when it lies two or more
// binades below R, and then the result's rounding point lies at least three places above the
// window's LSB). An exact zero sum is +0.
module mxr_add_round #(
    parameter int WX = 32, parameter int WY = 24, parameter int EB = 8, parameter int MB = 23,
    parameter int MODE = 0, parameter int SUBN = 1, parameter int OVF_INF = 0, parameter int EXW = 16
) (
    input  logic signed [WX-1:0]  x,
    input  logic signed [EXW-1:0] lsb_x,
    input  logic                  sign_y,
    input  logic [WY-1:0]         mag_y,
    input  logic signed [EXW-1:0] lsb_y,
    output logic [EB+MB:0]        code,
    output logic                  ovf
);
  localparam int MAXW = (WX > WY ? WX : WY) > MB + 1 ? (WX > WY ? WX : WY) : MB + 1;
  localparam int F = MAXW + 3;
  localparam int WO = F + 4;  // |term| < 2^(F+2) half LSBs: sign, F + 2 bits, one carry
  localparam int PX = $clog2(WX + 1) + 1;
  localparam int PY = $clog2(WY + 1) + 1;
  logic [WX-1:0] mag_x;
  logic [PX-1:0] top_x;
  logic [PY-1:0] top_y;
  logic signed [EXW-1:0] lead_x, lead_y, reference, wlsb;
  logic signed [WO-1:0] aligned_x, aligned_y, total;
  assign mag_x = x[WX-1] ? WX'(-x) : WX'(x);
  mxr_msb #(.W(WX), .PW(PX)) msb_x (.x(mag_x), .pos(top_x));
  mxr_msb #(.W(WY), .PW(PY)) msb_y (.x(mag_y), .pos(top_y));
  assign lead_x = lsb_x + EXW'($signed({1'b0, top_x}));
  assign lead_y = lsb_y + EXW'($signed({1'b0, top_y}));
  assign reference = (mag_x == '0) ? lead_y : (mag_y == '0) ? lead_x : (lead_x > lead_y) ? lead_x : lead_y;
  assign wlsb = reference - EXW'(F);
  mxr_window_term #(.WI(WX), .LMAX(F), .WO(WO), .MODE(3), .EXW(EXW)) align_x (
      .sign(x[WX-1]), .sig(mag_x), .lsb(lsb_x), .wlsb(wlsb), .out(aligned_x));
  mxr_window_term #(.WI(WY), .LMAX(F), .WO(WO), .MODE(3), .EXW(EXW)) align_y (
      .sign(sign_y), .sig(mag_y), .lsb(lsb_y), .wlsb(wlsb), .out(aligned_y));
  assign total = aligned_x + aligned_y;
  mxr_round #(.W(WO), .EB(EB), .MB(MB), .MODE(MODE), .SUBN(SUBN), .OVF_INF(OVF_INF), .EXW(EXW)) round_i (
      .sign(total[WO-1]), .mag(total[WO-1] ? WO'(-total) : WO'(total)), .lsb(wlsb - EXW'(1)),
      .code(code), .ovf(ovf));
endmodule

// A product's significand truncated toward zero to N + 1 significant bits
// (multiplier.product_fraction_bits N): the bits below the leading one's position - N cleared.
module mxr_truncate #(parameter int W = 8, parameter int N = 3) (
    input  logic [W-1:0] sig,
    output logic [W-1:0] out
);
  localparam int PW = $clog2(W + 1) + 1;
  logic [PW-1:0] top;
  mxr_msb #(.W(W), .PW(PW)) msb_i (.x(sig), .pos(top));
  assign out = (top > PW'(N)) ? sig & ~((W'(1) << (top - PW'(N))) - W'(1)) : sig;
endmodule
