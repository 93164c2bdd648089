// Einsum: one factor per label. A label in the output is pass-through; a label only in inputs is a reduction (sum).
// An operand dim of size 1 whose label is larger elsewhere is broadcast (no factor). Ellipsis dims are aligned to the
// right like numpy broadcasting and act as labels of their own; in implicit mode ("ij,jk") the output is the ellipsis
// dims followed by the labels that appear exactly once, in alphabetical (ASCII) order. A label repeated within one
// term (a diagonal, "ii->i") has no rule. Factors are numbered output labels first, then reduced labels in order of
// appearance, so "bsh,hf->bsf" reads like MatMul: ([i,j,l],[l,k])->([i,j,k]) reduction={l}.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>

#include <fmt/format.h>

#include "core/rules/gradient.h"
#include "core/rules/rule.h"
#include "core/rules/rule_maker.h"

namespace gspmd::rules_internal {
namespace {

constexpr int kEllipsisBase = 1000;  // label id of ellipsis dim p (right-aligned position among max ellipsis dims)

struct Term {
  std::vector<int> letters_before, letters_after;  // labels around "..."
  bool ellipsis = false;
};

std::optional<Term> parse_term(const std::string& t) {
  Term term;
  for (size_t i = 0; i < t.size(); ++i) {
    char c = t[i];
    if (c == '.') {
      if (term.ellipsis || t.compare(i, 3, "...") != 0) return std::nullopt;
      term.ellipsis = true;
      i += 2;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      (term.ellipsis ? term.letters_after : term.letters_before).push_back(c);
    } else {
      return std::nullopt;
    }
  }
  return term;
}

// Labels of a term with `rank` dims; `emax` = the largest ellipsis rank of the inputs.
std::optional<std::vector<int>> expand(const Term& t, int rank, int emax) {
  const int nl = static_cast<int>(t.letters_before.size() + t.letters_after.size());
  const int e = rank - nl;
  if (e < 0 || (!t.ellipsis && e != 0) || e > emax) return std::nullopt;
  std::vector<int> labels(t.letters_before.begin(), t.letters_before.end());
  for (int j = 0; j < e; ++j) labels.push_back(kEllipsisBase + emax - e + j);
  labels.insert(labels.end(), t.letters_after.begin(), t.letters_after.end());
  return labels;
}

RuleResult einsum_rule(const Graph& g, const Node& n) {
  if (n.inputs.empty() || n.outputs.size() != 1 || n.outputs[0] < 0) return reject("expects inputs and one output");
  std::string eq;
  for (char c : n.s("equation"))
    if (!std::isspace(static_cast<unsigned char>(c))) eq += c;
  const size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<Term> terms;
  size_t pos = 0;
  while (true) {
    size_t c = lhs.find(',', pos);
    const std::string term = lhs.substr(pos, c == std::string::npos ? std::string::npos : c - pos);
    auto t = parse_term(term);
    if (!t) return reject("cannot parse the term '{}' of equation '{}'", term, eq);
    terms.push_back(*t);
    if (c == std::string::npos) break;
    pos = c + 1;
  }
  if (terms.size() != n.inputs.size())
    return reject("equation '{}' has {} terms for {} inputs", eq, terms.size(), n.inputs.size());
  int emax = 0;
  for (size_t i = 0; i < terms.size(); ++i) {
    if (n.inputs[i] < 0) return reject("input {} is absent", i);
    const int rank = static_cast<int>(g.values.at(n.inputs[i]).shape.size());
    emax = std::max(emax, rank - static_cast<int>(terms[i].letters_before.size() + terms[i].letters_after.size()));
  }
  std::vector<std::vector<int>> in_labels;
  std::map<int, int64_t> size;
  std::map<int, int> count;
  std::vector<int> first_seen;
  for (size_t i = 0; i < terms.size(); ++i) {
    const Shape& s = g.values.at(n.inputs[i]).shape;
    auto labels = expand(terms[i], static_cast<int>(s.size()), emax);
    if (!labels) return reject("term {} of '{}' does not fit operand {}'s rank {}", i, eq, i, s.size());
    std::vector<int> sorted = *labels;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return reject("term {} of '{}' repeats a label (a diagonal)", i, eq);
    for (size_t d = 0; d < s.size(); ++d) {
      int l = (*labels)[d];
      if (!size.count(l)) first_seen.push_back(l);
      int64_t& sz = size[l];
      if (sz == 0 || sz == 1)
        sz = std::max<int64_t>(sz, s[d]);
      else if (s[d] != 1 && s[d] != sz)
        return reject("a label of '{}' has sizes {} and {}", eq, sz, s[d]);
      ++count[l];
    }
    in_labels.push_back(std::move(*labels));
  }
  std::vector<int> out_labels;
  if (arrow != std::string::npos) {
    auto t = parse_term(eq.substr(arrow + 2));
    if (!t) return reject("cannot parse the output term of equation '{}'", eq);
    const int nl = static_cast<int>(t->letters_before.size() + t->letters_after.size());
    auto labels = expand(*t, nl + (t->ellipsis ? emax : 0), emax);
    if (!labels) return reject("cannot expand the output term of equation '{}'", eq);
    out_labels = *labels;
  } else {
    for (int p = 0; p < emax; ++p) out_labels.push_back(kEllipsisBase + p);
    for (const auto& [l, c] : count)  // std::map: ascending, i.e. ASCII order for letters
      if (l < kEllipsisBase && c == 1) out_labels.push_back(l);
  }
  const Shape& out = g.values.at(n.outputs[0]).shape;
  if (out.size() != out_labels.size())
    return reject("the result has rank {}, equation '{}' gives {}", out.size(), eq, out_labels.size());
  {
    std::vector<int> sorted = out_labels;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
      return reject("the output term of '{}' repeats a label", eq);
  }
  RuleMaker m(g, n);
  std::map<int, int> factor;
  DimFactors dout(out.size());
  for (size_t d = 0; d < out.size(); ++d) {
    int l = out_labels[d];
    auto it = size.find(l);
    if (it == size.end() || (out[d] != it->second))
      return reject("result dim {} ({}) matches no input label of '{}'", d, out[d], eq);
    dout[d] = {factor[l] = m.factor(out[d], FactorKind::kPassThrough)};
  }
  for (int l : first_seen)
    if (!factor.count(l)) factor[l] = m.factor(size[l], FactorKind::kReduction);
  for (size_t i = 0; i < terms.size(); ++i) {
    const Shape& s = m.in(i);
    DimFactors df(s.size());
    for (size_t d = 0; d < s.size(); ++d) {
      int l = in_labels[i][d];
      if (s[d] == 1 && size[l] != 1) continue;  // broadcast
      df[d] = {factor.at(l)};
    }
    m.operand(i, std::move(df));
  }
  // Multilinear (the partitioner allows one partial operand).
  m.result(0, std::move(dout)).reduction(ReductionKind::kSum).all_linear();
  return m.build();
}

}  // namespace

void register_einsum_rules() { add_builtin("Einsum", einsum_rule); }

// ---- gradients ----
namespace {

/// Einsum with explicit output, no ellipsis and no label repeated within a term: the gradient of operand i is the
/// einsum of dy with the other operands into operand i's labels ("ij,jk->ik": dA = "ik,jk->ij"), summed back over
/// its size-1 broadcast dims. A label of operand i that is in no other term (summed over in i alone) is not supported.
void einsum_grad(GradContext& c) {
  if (c.dy(0) < 0) return;
  const Node& n = c.node();
  const std::string eq = [&] {
    std::string e;
    for (char ch : n.s("equation"))
      if (ch != ' ') e += ch;
    return e;
  }();
  const size_t arrow = eq.find("->");
  auto fail = [&](const std::string& why) {
    throw InputError(fmt::format("--training: node '{}' (Einsum): no gradient for equation '{}': {}", n.name, eq, why));
  };
  if (arrow == std::string::npos) fail("implicit output");
  if (eq.find('.') != std::string::npos) fail("ellipsis");
  std::vector<std::string> terms;
  for (size_t b = 0, e; b <= arrow; b = e + 1) {
    e = eq.find(',', b);
    if (e == std::string::npos || e > arrow) e = arrow;
    terms.push_back(eq.substr(b, e - b));
  }
  const std::string out = eq.substr(arrow + 2);
  for (const std::string& t : terms)
    for (char ch : t)
      if (std::count(t.begin(), t.end(), ch) > 1) fail("a label repeated within a term");
  for (size_t i = 0; i < terms.size(); ++i) {
    if (!c.wants(i)) continue;
    std::string others = out;
    std::vector<int> inputs{c.dy(0)};
    std::string lhs = out;
    for (size_t j = 0; j < terms.size(); ++j) {
      if (j == i) continue;
      lhs += "," + terms[j];
      others += terms[j];
      inputs.push_back(c.x(j));
    }
    for (char ch : terms[i])
      if (others.find(ch) == std::string::npos) fail(fmt::format("label '{}' is summed within one operand", ch));
    const int d = c.op("Einsum", inputs, {{"equation", lhs + "->" + terms[i]}});
    c.set_dx(i, c.sum_to(d, c.value(c.x(i)).shape));
  }
}

}  // namespace

void register_einsum_gradients() { add_builtin_gradient("Einsum", einsum_grad); }

}  // namespace gspmd::rules_internal
