// Syntax tree of a parsed Jinja template: expressions and statements with their source positions.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/template/jinja_value.h"

namespace anchorage::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // literal
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items (keys) and values
    kAttr,       // object, name
    kSubscript,  // object, items[0]
    kSlice,      // object, items = {start, stop, step} (null when absent)
    kCall,       // object (callee), items (positional), kwargs
    kFilter,     // object (may be null inside a filter block), name, items, kwargs
    kTest,       // object, name, items, kwargs, negated
    kUnary,      // op ("-", "+", "not"), object
    kBinary,     // op, items = {lhs, rhs}; and/or short-circuit
    kCompare,    // object (first), ops and items (operands)
    kCondition,  // items = {then, cond, else or null}
  };
  Kind kind;
  int line = 0;
  int column = 0;
  Value literal;
  std::string name;
  std::string op;
  bool negated = false;
  ExprPtr object;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> values;
  std::vector<std::string> ops;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
};

struct Stmt;
using StmtPtr = std::shared_ptr<const Stmt>;
using StmtList = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // expr
    kIf,           // conditions[i] guards bodies[i]; else_body
    kFor,          // targets, expr (iterable), condition (filter or null), body, else_body
    kSet,          // targets (names) or target_object.target_attr, expr
    kSetBlock,     // targets[0], body, filters (filter chain applied to the capture)
    kMacro,        // name, params, defaults, body
    kCallBlock,    // expr (the call), params (caller's), body
    kFilterBlock,  // filters, body
    kBreak,
    kContinue,
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  std::string name;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<ExprPtr> conditions;
  std::vector<StmtList> bodies;
  StmtList body;
  StmtList else_body;
  std::vector<std::string> targets;
  std::string target_object;
  std::string target_attr;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param, null when it has none
  std::vector<ExprPtr> filters;   // kFilter exprs with a null object, applied in order
};

// Parses `source` as Jinja with trim_blocks and lstrip_blocks; throws JinjaError with a line.
StmtList ParseTemplate(const std::string& source);

// Known filter and test names, so that unknown ones fail at parse time as in jinja2.
bool IsKnownFilter(const std::string& name);
bool IsKnownTest(const std::string& name);

}  // namespace anchorage::jinja
