// core/ir: symbolic dim sizes (docs/shapes.md). A dim is a number or an integer expression over named symbols
// (`batch`, `past_len + 1`, `ceil(batch / 2)`): ONNX's dim_param, carried through shape functions and partitioning so
// that one partitioned program serves every value of the symbols. The expressions follow JAX's shape polymorphism
// (jax.export's symbolic dims: sums of products of symbols and of floor/ceil divisions by constants, compared only
// where the comparison is decidable) and torch's SymInt (a symbol is a dim, so it is never negative).
// Depends only on the standard library and core/ir/ir.h's errors (invariant 6).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gspmd {

/// Values of dim symbols: symbol name -> size (>= 0). What `--dim NAME=V` and the inputs' shapes bind.
using DimBindings = std::map<std::string, int64_t, std::less<>>;

/// An integer expression over named dim symbols, kept in one canonical form: a constant plus a sum of terms, each
/// an integer coefficient times a product of atoms; an atom is a symbol or floor(e / d), ceil(e / d), mod(e, d),
/// min(a, b), max(a, b) of expressions (d a positive constant). Two expressions that are equal as polynomials in
/// their atoms compare equal (`batch + 1 - 1 == batch`, `2 * (a + b) == 2*a + 2*b`); what the canonical form cannot
/// decide is reported as unknown, never guessed (known_eq, known_ge).
///
/// Symbols stand for dims, so they are >= 0; a division's divisor is a positive constant. Arithmetic is exact on
/// int64: a constant or coefficient that overflows throws InputError; an expression of more than kMaxTerms terms
/// throws DimExprTooLarge (ir.h), one nested deeper than kMaxDepth InputError (hostile dim_param text cannot make it
/// blow up).
/// Copies share their atoms (immutable); an expression is a few machine words plus its terms.
class DimExpr {
 public:
  static constexpr size_t kMaxTerms = 64;
  static constexpr int kMaxDepth = 32;

  /// The constant 0.
  DimExpr() = default;
  /// A constant (implicit: a static dim is a DimExpr).
  DimExpr(int64_t value) : constant_(value) {}  // NOLINT(google-explicit-constructor)
  /// The symbol `name` (non-empty; any text: an ONNX dim_param need not be an identifier). Throws InputError when
  /// empty.
  static DimExpr symbol(std::string_view name);
  /// Reads the text str() writes: integers, symbols (identifiers: a letter or '_', then letters, digits, '_', '.'),
  /// `+`, `-`, `*`, parentheses, `floor(e / d)` (also `e // d`), `ceil(e / d)`, `mod(e, d)`, `min(a, b)`, `max(a, b)`
  /// with d a positive integer. Throws InputError("dim expression '<text>': <problem> at column <c>").
  static DimExpr parse(std::string_view text);
  /// An ONNX dim_param: the expression parse() reads, or else the whole text as one symbol (ONNX allows any text).
  /// Never throws for a non-empty text.
  static DimExpr from_dim_param(std::string_view text);

  friend DimExpr operator+(const DimExpr& a, const DimExpr& b);
  friend DimExpr operator-(const DimExpr& a, const DimExpr& b);
  friend DimExpr operator-(const DimExpr& a);
  friend DimExpr operator*(const DimExpr& a, const DimExpr& b);
  /// floor(a / d), ceil(a / d) and a mod d (in [0, d)) for a positive constant d; std::invalid_argument when d <= 0.
  /// The terms whose coefficients d divides leave the division: floor((2*b + 1) / 2) = b + floor(1 / 2) = b.
  friend DimExpr floor_div(const DimExpr& a, int64_t d);
  friend DimExpr ceil_div(const DimExpr& a, int64_t d);
  friend DimExpr mod(const DimExpr& a, int64_t d);
  friend DimExpr min(const DimExpr& a, const DimExpr& b);
  friend DimExpr max(const DimExpr& a, const DimExpr& b);
  /// The q with b * q == a for every value of the symbols, when the canonical forms show one: a constant divisor
  /// that divides every coefficient, or a quotient of one term by another that multiplies back to a
  /// (`(16*b*s) / (4*b) = 4*s`, `(2*b + 2*s) / (b + s) = 2`), as Reshape's inferred -1 dim needs; nullopt otherwise
  /// (never a rounded quotient), and for b == 0.
  friend std::optional<DimExpr> exact_div(const DimExpr& a, const DimExpr& b);

  /// Structural equality of the canonical forms.
  bool operator==(const DimExpr& o) const;
  bool is_constant() const { return terms_.empty(); }
  /// The value when constant, else nullopt.
  std::optional<int64_t> constant() const { return is_constant() ? std::optional<int64_t>(constant_) : std::nullopt; }
  /// The symbols it reads, sorted, each once.
  std::vector<std::string> symbols() const;
  /// The symbol's name when the expression is exactly one symbol (`batch`, not `batch + 1` or `2*batch`), else
  /// nullptr. Points into the expression.
  const std::string* as_symbol() const;

  /// The value with every symbol bound. Throws InputError("dim 'x' is not bound (--dim x=N)") for an unbound
  /// symbol, InputError on overflow.
  int64_t eval(const DimBindings& b) const;
  /// The expression with the bound symbols replaced by their values (the others kept): `--dim` specialising a model.
  DimExpr subst(const DimBindings& b) const;

  /// a == b for every value of the symbols (true), for none (false), or unknown (nullopt).
  friend std::optional<bool> known_eq(const DimExpr& a, const DimExpr& b);
  /// a >= b for every value of the symbols (true), for none (false), or unknown (nullopt). Decided from the sign of
  /// a - b: its constant plus terms that are all >= 0 (positive coefficients of non-negative atoms) or all <= 0.
  friend std::optional<bool> known_ge(const DimExpr& a, const DimExpr& b);

  /// "2*batch + past_len + 1", "ceil(batch / 2)", "-1": what parse() reads back; terms in a fixed order.
  std::string str() const;
  /// The canonical form, for code that rebuilds the expression elsewhere (the exporter writes it as ONNX ops): the
  /// constant, and the terms (coefficient times the product of the atoms), the expression being their sum.
  int64_t constant_part() const { return constant_; }
  struct Term;
  const std::vector<Term>& terms() const { return terms_; }

  /// An atom: a symbol, or a function of expressions that the canonical form keeps opaque. (a mod d is written
  /// a - d*floor(a / d), so it needs no atom of its own.)
  struct Atom {
    enum class Kind { kSymbol, kFloor, kCeil, kMin, kMax };
    Kind kind = Kind::kSymbol;
    std::string name;           // kSymbol
    std::vector<DimExpr> args;  // kFloor/kCeil: {numerator}; kMin/kMax: {a, b}, ordered by their text
    int64_t divisor = 0;        // kFloor/kCeil
    std::string key;            // canonical text: atoms compare by it, and print it
    int depth = 0;              // nesting of function atoms (a symbol: 0)
  };
  struct Term {
    std::vector<std::shared_ptr<const Atom>> atoms;  // sorted by key, with repeats for powers
    int64_t coef = 0;                                // never 0 in a canonical expression
    std::string key;                                 // the atoms' keys, joined: terms are sorted and merged by it
  };

 private:
  int64_t constant_ = 0;
  std::vector<Term> terms_;  // sorted by key, merged, no zero coefficients

  static DimExpr of_atom(std::shared_ptr<const Atom> a);
  static DimExpr of_term(const Term& t, int64_t coef);
  static DimExpr divide(const DimExpr& a, int64_t d, bool ceil);
  static DimExpr extremum(const DimExpr& a, const DimExpr& b, bool is_max);
  void add_term(Term t);
  DimExpr scaled(int64_t k) const;
  int depth() const;
};

/// "[batch, seq + past, 64]": a list of dims as text (error messages, explain).
std::string dims_str(const std::vector<DimExpr>& dims);
/// "batch=17, seq=19" (with `sep` between the bindings): bindings as text (messages, device-file metadata).
std::string bindings_str(const DimBindings& b, std::string_view sep = ", ");

}  // namespace gspmd
