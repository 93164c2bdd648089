// The SPMD program's own methods (core/program/program.h).
#include "core/program/program.h"

namespace gspmd {

DimExpr SpmdProgram::attr_expr(int node, const std::string& attr, int64_t value) const {
  for (const SymbolicAttr& a : sym_attrs)
    if (a.node == node && a.attr == attr) return a.expr;
  return value;
}

}  // namespace gspmd
