// core/ir: symbolic dim sizes, canonical form and arithmetic (dim_expr.h).
#include "core/ir/dim_expr.h"

#include <algorithm>
#include <cctype>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "core/ir/ir.h"

namespace gspmd {

namespace {

using Atom = DimExpr::Atom;

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r)) throw InputError("dim expression overflows int64");
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r)) throw InputError("dim expression overflows int64");
  return r;
}

// Division rounding toward -inf and toward +inf, for d > 0.
int64_t floor_div_int(int64_t a, int64_t d) { return a / d - ((a % d != 0) && (a < 0)); }
int64_t ceil_div_int(int64_t a, int64_t d) { return a / d + ((a % d != 0) && (a > 0)); }

bool is_function_name(std::string_view s) {
  return s == "floor" || s == "ceil" || s == "mod" || s == "min" || s == "max";
}

// A symbol prints as itself when parse() reads it back as that symbol; any other name is quoted.
bool is_plain_name(std::string_view s) {
  if (s.empty() || !(std::isalpha(static_cast<unsigned char>(s[0])) || s[0] == '_') || is_function_name(s))
    return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.'; });
}

void check_divisor(int64_t d) {
  if (d <= 0) throw std::invalid_argument(fmt::format("dim expression: divisor {} is not positive", d));
}

// An atom's value is never negative when it is a symbol, or a division, min or max of such values.
std::optional<bool> atom_nonnegative(const Atom& a);

}  // namespace

// ---- building ---------------------------------------------------------------------------------------------------

DimExpr DimExpr::of_atom(std::shared_ptr<const Atom> a) {
  if (a->depth > kMaxDepth) throw InputError(fmt::format("dim expression nested deeper than {}", kMaxDepth));
  DimExpr e;
  Term t;
  t.coef = 1;
  t.key = a->key;
  t.atoms.push_back(std::move(a));
  e.terms_.push_back(std::move(t));
  return e;
}

DimExpr DimExpr::of_term(const Term& t, int64_t coef) {
  DimExpr e;
  Term c = t;
  c.coef = coef;
  e.add_term(std::move(c));
  return e;
}

DimExpr DimExpr::symbol(std::string_view name) {
  if (name.empty()) throw InputError("a dim symbol has an empty name");
  auto a = std::make_shared<Atom>();
  a->name = std::string(name);
  a->key = is_plain_name(name) ? a->name : "'" + a->name + "'";
  return of_atom(std::move(a));
}

void DimExpr::add_term(Term t) {
  if (t.coef == 0) return;
  auto it = std::lower_bound(terms_.begin(), terms_.end(), t.key,
                             [](const Term& x, const std::string& k) { return x.key < k; });
  if (it != terms_.end() && it->key == t.key) {
    it->coef = checked_add(it->coef, t.coef);
    if (it->coef == 0) terms_.erase(it);
    return;
  }
  if (terms_.size() >= kMaxTerms)
    throw DimExprTooLarge(fmt::format("dim expression has more than {} terms", kMaxTerms));
  terms_.insert(it, std::move(t));
}

DimExpr DimExpr::scaled(int64_t k) const {
  if (k == 0) return {};
  DimExpr r = *this;
  r.constant_ = checked_mul(constant_, k);
  for (Term& t : r.terms_) t.coef = checked_mul(t.coef, k);
  return r;
}

int DimExpr::depth() const {
  int d = 0;
  for (const Term& t : terms_)
    for (const auto& a : t.atoms) d = std::max(d, a->depth);
  return d;
}

DimExpr operator+(const DimExpr& a, const DimExpr& b) {
  const bool a_larger = a.terms_.size() >= b.terms_.size();
  DimExpr r = a_larger ? a : b;
  r.constant_ = checked_add(a.constant_, b.constant_);
  for (const auto& t : (a_larger ? b : a).terms_) r.add_term(t);
  return r;
}

DimExpr operator-(const DimExpr& a) { return a.scaled(-1); }
DimExpr operator-(const DimExpr& a, const DimExpr& b) { return a + b.scaled(-1); }

DimExpr operator*(const DimExpr& a, const DimExpr& b) {
  if (auto c = a.constant()) return b.scaled(*c);
  if (auto c = b.constant()) return a.scaled(*c);
  DimExpr r = a.scaled(b.constant_) + b.scaled(a.constant_);
  r.constant_ = checked_mul(a.constant_, b.constant_);
  for (const auto& x : a.terms_)
    for (const auto& y : b.terms_) {
      DimExpr::Term t;
      t.coef = checked_mul(x.coef, y.coef);
      t.atoms = x.atoms;
      t.atoms.insert(t.atoms.end(), y.atoms.begin(), y.atoms.end());
      std::sort(t.atoms.begin(), t.atoms.end(), [](const auto& p, const auto& q) { return p->key < q->key; });
      for (size_t i = 0; i < t.atoms.size(); ++i) t.key += (i ? "*" : "") + t.atoms[i]->key;
      r.add_term(std::move(t));
    }
  return r;
}

/// floor or ceil of a / d. With a = d*Q + R, where R keeps each coefficient's and the constant's remainder modulo d
/// (in [0, d)), floor(a / d) = Q + floor(R / d) exactly (Q is an integer); so `floor((2*b + 3) / 2)` is
/// `b + 1 + floor(1 / 2)` = `b + 1`, and what stays in the division has coefficients in [1, d).
DimExpr DimExpr::divide(const DimExpr& a, int64_t d, bool ceil) {
  check_divisor(d);
  if (d == 1) return a;
  DimExpr q = floor_div_int(a.constant_, d), rest = a.constant_ - floor_div_int(a.constant_, d) * d;
  for (const Term& t : a.terms_) {
    const int64_t tq = floor_div_int(t.coef, d);
    q = q + of_term(t, tq);
    rest = rest + of_term(t, t.coef - tq * d);
  }
  if (auto c = rest.constant()) return q + (ceil ? ceil_div_int(*c, d) : floor_div_int(*c, d));
  const Atom::Kind kind = ceil ? Atom::Kind::kCeil : Atom::Kind::kFloor;
  // floor(floor(x / a) / b) = floor(x / (a*b)), and the same for ceil, for positive a and b.
  if (rest.constant_ == 0 && rest.terms_.size() == 1 && rest.terms_[0].coef == 1 && rest.terms_[0].atoms.size() == 1 &&
      rest.terms_[0].atoms[0]->kind == kind) {
    const Atom& inner = *rest.terms_[0].atoms[0];
    return q + divide(inner.args[0], checked_mul(inner.divisor, d), ceil);
  }
  auto at = std::make_shared<Atom>();
  at->kind = kind;
  const std::string num = rest.terms_.size() == 1 && rest.constant_ == 0 ? rest.str() : "(" + rest.str() + ")";
  at->key = fmt::format("{}({} / {})", ceil ? "ceil" : "floor", num, d);
  at->depth = rest.depth() + 1;
  at->args = {std::move(rest)};
  at->divisor = d;
  return q + of_atom(std::move(at));
}

DimExpr floor_div(const DimExpr& a, int64_t d) { return DimExpr::divide(a, d, false); }
DimExpr ceil_div(const DimExpr& a, int64_t d) { return DimExpr::divide(a, d, true); }
DimExpr mod(const DimExpr& a, int64_t d) { return a - floor_div(a, d).scaled(d); }

std::optional<DimExpr> exact_div(const DimExpr& a, const DimExpr& b) {
  if (auto c = b.constant()) {
    if (*c == 0 || a.constant_ % *c != 0) return std::nullopt;
    for (const DimExpr::Term& t : a.terms_)
      if (t.coef % *c != 0) return std::nullopt;
    DimExpr q = a.constant_ / *c;
    for (const DimExpr::Term& t : a.terms_) q.add_term(DimExpr::Term{t.atoms, t.coef / *c, t.key});
    return q;
  }
  if (a == DimExpr(0)) return DimExpr(0);
  auto check = [&](const DimExpr& q) { return b * q == a ? std::optional<DimExpr>(q) : std::nullopt; };
  if (b.constant_ != 0 && a.constant_ % b.constant_ == 0)
    if (auto q = check(a.constant_ / b.constant_)) return q;
  // a's term over b's first term, for each of a's terms: the atoms of b's term must be among the term's (both are
  // sorted by key, repeats for powers).
  const DimExpr::Term& tb = b.terms_.front();
  for (const DimExpr::Term& ta : a.terms_) {
    if (ta.coef % tb.coef != 0) continue;
    DimExpr::Term rest;
    size_t j = 0;
    for (const auto& at : ta.atoms) {
      if (j < tb.atoms.size() && at->key == tb.atoms[j]->key)
        ++j;
      else
        rest.atoms.push_back(at);
    }
    if (j != tb.atoms.size()) continue;
    for (size_t i = 0; i < rest.atoms.size(); ++i) rest.key += (i ? "*" : "") + rest.atoms[i]->key;
    const int64_t coef = ta.coef / tb.coef;
    if (auto q = check(rest.atoms.empty() ? DimExpr(coef) : DimExpr::of_term(rest, coef))) return q;
  }
  return std::nullopt;
}

DimExpr DimExpr::extremum(const DimExpr& a, const DimExpr& b, bool is_max) {
  if (std::optional<bool> ge = known_ge(a, b)) return *ge == is_max ? a : b;
  if (std::optional<bool> le = known_ge(b, a)) return *le == is_max ? b : a;
  std::string sa = a.str(), sb = b.str();
  const bool swap = sb < sa;
  auto at = std::make_shared<Atom>();
  at->kind = is_max ? Atom::Kind::kMax : Atom::Kind::kMin;
  at->key = fmt::format("{}({}, {})", is_max ? "max" : "min", swap ? sb : sa, swap ? sa : sb);
  at->depth = std::max(a.depth(), b.depth()) + 1;
  at->args = swap ? std::vector<DimExpr>{b, a} : std::vector<DimExpr>{a, b};
  return of_atom(std::move(at));
}

DimExpr min(const DimExpr& a, const DimExpr& b) { return DimExpr::extremum(a, b, false); }
DimExpr max(const DimExpr& a, const DimExpr& b) { return DimExpr::extremum(a, b, true); }

// ---- reading -----------------------------------------------------------------------------------------------------

bool DimExpr::operator==(const DimExpr& o) const {
  if (constant_ != o.constant_ || terms_.size() != o.terms_.size()) return false;
  for (size_t i = 0; i < terms_.size(); ++i)
    if (terms_[i].coef != o.terms_[i].coef || terms_[i].key != o.terms_[i].key) return false;
  return true;
}

std::vector<std::string> DimExpr::symbols() const {
  std::set<std::string> out;
  std::vector<const DimExpr*> todo = {this};
  while (!todo.empty()) {
    const DimExpr* e = todo.back();
    todo.pop_back();
    for (const Term& t : e->terms_)
      for (const auto& a : t.atoms) {
        if (a->kind == Atom::Kind::kSymbol) out.insert(a->name);
        for (const DimExpr& x : a->args) todo.push_back(&x);
      }
  }
  return {out.begin(), out.end()};
}

const std::string* DimExpr::as_symbol() const {
  if (constant_ != 0 || terms_.size() != 1 || terms_[0].coef != 1 || terms_[0].atoms.size() != 1) return nullptr;
  const Atom& a = *terms_[0].atoms[0];
  return a.kind == Atom::Kind::kSymbol ? &a.name : nullptr;
}

namespace {

int64_t eval_atom(const Atom& a, const DimBindings& b) {
  switch (a.kind) {
    case Atom::Kind::kSymbol: {
      auto it = b.find(a.name);
      if (it == b.end()) throw InputError(fmt::format("dim '{}' is not bound (--dim {}=N)", a.name, a.name));
      return it->second;
    }
    case Atom::Kind::kFloor: return floor_div_int(a.args[0].eval(b), a.divisor);
    case Atom::Kind::kCeil: return ceil_div_int(a.args[0].eval(b), a.divisor);
    case Atom::Kind::kMin: return std::min(a.args[0].eval(b), a.args[1].eval(b));
    case Atom::Kind::kMax: return std::max(a.args[0].eval(b), a.args[1].eval(b));
  }
  return 0;
}

DimExpr subst_atom(const std::shared_ptr<const Atom>& a, const DimBindings& b, const DimExpr& self) {
  switch (a->kind) {
    case Atom::Kind::kSymbol: {
      auto it = b.find(a->name);
      return it == b.end() ? self : DimExpr(it->second);
    }
    case Atom::Kind::kFloor: return floor_div(a->args[0].subst(b), a->divisor);
    case Atom::Kind::kCeil: return ceil_div(a->args[0].subst(b), a->divisor);
    case Atom::Kind::kMin: return min(a->args[0].subst(b), a->args[1].subst(b));
    case Atom::Kind::kMax: return max(a->args[0].subst(b), a->args[1].subst(b));
  }
  return self;
}

std::optional<bool> atom_nonnegative(const Atom& a) {
  const DimExpr zero;
  switch (a.kind) {
    case Atom::Kind::kSymbol: return true;
    case Atom::Kind::kFloor:
    case Atom::Kind::kCeil: return known_ge(a.args[0], zero) == true ? std::optional<bool>(true) : std::nullopt;
    case Atom::Kind::kMin:
      return known_ge(a.args[0], zero) == true && known_ge(a.args[1], zero) == true ? std::optional<bool>(true)
                                                                                    : std::nullopt;
    case Atom::Kind::kMax:
      return known_ge(a.args[0], zero) == true || known_ge(a.args[1], zero) == true ? std::optional<bool>(true)
                                                                                    : std::nullopt;
  }
  return std::nullopt;
}

}  // namespace

int64_t DimExpr::eval(const DimBindings& b) const {
  int64_t v = constant_;
  for (const Term& t : terms_) {
    int64_t p = t.coef;
    for (const auto& a : t.atoms) p = checked_mul(p, eval_atom(*a, b));
    v = checked_add(v, p);
  }
  return v;
}

DimExpr DimExpr::subst(const DimBindings& b) const {
  DimExpr r = constant_;
  for (const Term& t : terms_) {
    DimExpr p = t.coef;
    for (const auto& a : t.atoms) p = p * subst_atom(a, b, of_atom(a));
    r = r + p;
  }
  return r;
}

std::optional<bool> known_ge(const DimExpr& a, const DimExpr& b) {
  const DimExpr d = a - b;
  if (auto c = d.constant()) return *c >= 0;
  bool all_nonneg = true, all_nonpos = true;  // every term's sign, for every value of the symbols
  for (const DimExpr::Term& t : d.terms_) {
    const bool atoms_nonneg =
        std::all_of(t.atoms.begin(), t.atoms.end(), [](const auto& x) { return atom_nonnegative(*x) == true; });
    all_nonneg = all_nonneg && atoms_nonneg && t.coef > 0;
    all_nonpos = all_nonpos && atoms_nonneg && t.coef < 0;
  }
  if (all_nonneg && d.constant_ >= 0) return true;
  if (all_nonpos && d.constant_ < 0) return false;
  return std::nullopt;
}

std::optional<bool> known_eq(const DimExpr& a, const DimExpr& b) {
  const DimExpr d = a - b;
  if (auto c = d.constant()) return *c == 0;
  if (known_ge(d, 1) == true || known_ge(-d, 1) == true) return false;
  return std::nullopt;
}

std::string DimExpr::str() const {
  std::string s;
  auto put = [&](int64_t coef, const std::string& body) {  // body empty: the constant
    const bool neg = coef < 0;
    const uint64_t mag = neg ? 0 - static_cast<uint64_t>(coef) : static_cast<uint64_t>(coef);
    if (s.empty())
      s += neg ? "-" : "";
    else
      s += neg ? " - " : " + ";
    if (body.empty())
      s += std::to_string(mag);
    else
      s += mag == 1 ? body : std::to_string(mag) + "*" + body;
  };
  for (const Term& t : terms_) put(t.coef, t.key);
  if (constant_ != 0 || terms_.empty()) put(constant_, "");
  return s;
}

// ---- parsing -----------------------------------------------------------------------------------------------------

namespace {

/// Recursive descent over dim_expr.h's grammar; depth-limited, so hostile text cannot exhaust the stack.
class Parser {
 public:
  explicit Parser(std::string_view text) : t_(text) {}

  DimExpr all() {
    DimExpr e = expr(0);
    skip();
    if (p_ != t_.size()) fail("unexpected '" + std::string(1, t_[p_]) + "'");
    return e;
  }

 private:
  std::string_view t_;
  size_t p_ = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(fmt::format("dim expression '{}': {} at column {}", cut_text(t_, 40), what, p_ + 1));
  }
  void skip() {
    while (p_ < t_.size() && std::isspace(static_cast<unsigned char>(t_[p_]))) ++p_;
  }
  bool eat(std::string_view tok) {
    skip();
    if (t_.substr(p_, tok.size()) != tok) return false;
    p_ += tok.size();
    return true;
  }
  void expect(std::string_view tok) {
    if (!eat(tok)) fail(fmt::format("expected '{}'", tok));
  }
  void check_depth(int depth) const {
    if (depth > 4 * DimExpr::kMaxDepth) fail("nested too deeply");
  }

  int64_t integer() {
    skip();
    if (p_ >= t_.size() || !std::isdigit(static_cast<unsigned char>(t_[p_]))) fail("expected an integer");
    int64_t v = 0;
    while (p_ < t_.size() && std::isdigit(static_cast<unsigned char>(t_[p_])))
      v = checked_add(checked_mul(v, 10), t_[p_++] - '0');
    return v;
  }
  int64_t divisor() {
    const int64_t d = integer();
    if (d == 0) fail("division by 0");
    return d;
  }

  DimExpr expr(int depth) {
    check_depth(depth);
    DimExpr e = term(depth + 1);
    while (true) {
      if (eat("+"))
        e = e + term(depth + 1);
      else if (eat("-"))
        e = e - term(depth + 1);
      else
        return e;
    }
  }

  DimExpr term(int depth) {
    DimExpr e = unary(depth + 1);
    while (true) {
      if (eat("//"))
        e = floor_div(e, divisor());
      else if (eat("*"))
        e = e * unary(depth + 1);
      else
        return e;
    }
  }

  DimExpr unary(int depth) {
    check_depth(depth);
    if (eat("-")) return -unary(depth + 1);
    return primary(depth + 1);
  }

  DimExpr primary(int depth) {
    skip();
    if (p_ >= t_.size()) fail("unexpected end");
    const char c = t_[p_];
    if (std::isdigit(static_cast<unsigned char>(c))) return integer();
    if (eat("(")) {
      DimExpr e = expr(depth + 1);
      expect(")");
      return e;
    }
    if (c == '\'') {
      const size_t end = t_.find('\'', p_ + 1);
      if (end == std::string_view::npos || end == p_ + 1) fail("unterminated or empty quoted name");
      const std::string_view name = t_.substr(p_ + 1, end - p_ - 1);
      p_ = end + 1;
      return DimExpr::symbol(name);
    }
    if (!(std::isalpha(static_cast<unsigned char>(c)) || c == '_')) fail("unexpected '" + std::string(1, c) + "'");
    const size_t start = p_;
    while (p_ < t_.size() && (std::isalnum(static_cast<unsigned char>(t_[p_])) || t_[p_] == '_' || t_[p_] == '.')) ++p_;
    const std::string_view name = t_.substr(start, p_ - start);
    if (!is_function_name(name)) return DimExpr::symbol(name);
    expect("(");
    DimExpr a = expr(depth + 1);
    DimExpr r;
    if (name == "floor" || name == "ceil") {
      expect("/");
      const int64_t d = divisor();
      r = name == "floor" ? floor_div(a, d) : ceil_div(a, d);
    } else {
      expect(",");
      if (name == "mod") {
        r = mod(a, divisor());
      } else {
        DimExpr b = expr(depth + 1);
        r = name == "min" ? min(a, b) : max(a, b);
      }
    }
    expect(")");
    return r;
  }
};

}  // namespace

DimExpr DimExpr::parse(std::string_view text) { return Parser(text).all(); }

DimExpr DimExpr::from_dim_param(std::string_view text) {
  try {
    return parse(text);
  } catch (const InputError&) {
    return symbol(text);
  }
}

std::string dims_str(const std::vector<DimExpr>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].str();
  return s + "]";
}

std::string bindings_str(const DimBindings& b, std::string_view sep) {
  std::string s;
  for (const auto& [name, v] : b) s += fmt::format("{}{}={}", s.empty() ? "" : sep, name, v);
  return s;
}

}  // namespace gspmd
