// Jinja runtime values with Python semantics (truthiness, equality, str() and repr()).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace anchorage::jinja {

// Thrown inside the interpreter only; Template::Render turns it into a Status.
class JinjaError : public std::runtime_error {
 public:
  enum class Kind { kError, kRaised, kLimit };  // kRaised: raise_exception(); kLimit: a RenderLimits bound
  JinjaError(std::string message, int line = 0, int column = 0, Kind kind = Kind::kError)
      : std::runtime_error(std::move(message)), line_(line), column_(column), kind_(kind) {}
  static JinjaError Raised(std::string message) { return JinjaError(std::move(message), 0, 0, Kind::kRaised); }
  static JinjaError Limit(std::string message) { return JinjaError(std::move(message), 0, 0, Kind::kLimit); }
  int line() const { return line_; }
  int column() const { return column_; }
  bool has_location() const { return line_ > 0; }
  Kind kind() const { return kind_; }

 private:
  int line_;
  int column_;
  Kind kind_;
};

class Value;
struct ValueDict;
struct Callable;
using ValueList = std::vector<Value>;

class Value {
 public:
  // kGenerator: a filter result jinja2 yields lazily (map, select, ...): iterable, always true, no len().
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kCallable, kGenerator };

  Value() = default;  // undefined
  static Value Undefined(std::string hint = {});
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value List(ValueList items, bool is_tuple = false);
  static Value Dict(std::shared_ptr<ValueDict> dict);
  static Value EmptyDict();
  static Value Namespace(std::shared_ptr<ValueDict> attrs);
  static Value Function(std::shared_ptr<Callable> fn);
  // `deferred_error`, when set, is thrown on iteration (jinja2 fails lazily there).
  static Value Generator(ValueList items, std::string deferred_error = {});
  static Value FromJson(const nlohmann::ordered_json& j);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }
  bool is_generator() const { return kind_ == Kind::kGenerator; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (bool_ ? 1 : 0) : int_; }
  double as_double() const;                              // for int, float and bool
  const std::string& as_string() const { return str_; }  // the string, or the undefined's name hint
  const ValueList& as_list() const { return *list_; }
  ValueDict& as_dict() const { return *dict_; }  // dict and namespace
  const std::shared_ptr<ValueDict>& dict_ptr() const { return dict_; }
  const Callable& as_callable() const { return *fn_; }

  bool Truthy() const;           // Python bool()
  std::string Str() const;       // Python str(); undefined prints as ""
  std::string Repr() const;      // Python repr()
  std::string ItemsRepr() const; // "'k': v, ..." of a dict or namespace, as repr writes them
  std::string TypeName() const;  // Python type name for error messages
  // Items produced by iteration: list elements, dict keys, string characters; throws otherwise.
  ValueList Iterate() const;
  // Length as Python len(); throws for values without one.
  int64_t Length() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  bool is_tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string str_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<Callable> fn_;
};

// A dict with Python's insertion order and string keys.
struct ValueDict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
};

// Positional and keyword arguments of a call.
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;
  // The argument at `index` or named `name`, or `fallback` when absent.
  Value Get(size_t index, const std::string& name, Value fallback = Value()) const;
  bool Has(size_t index, const std::string& name) const;
};

struct Callable {
  std::string name;
  std::function<Value(const CallArgs&)> fn;  // throws JinjaError on failure
};

bool PyEquals(const Value& a, const Value& b);
// Python ordering (<0, 0, >0) for numbers, strings and lists; throws for other pairs.
int PyCompare(const Value& a, const Value& b);
std::string PyFloatRepr(double d);
// json.dumps(v, ensure_ascii, indent, separators, sort_keys); indent < 0 means None.
std::string ToJson(const Value& v, int indent, const std::string& item_sep, const std::string& key_sep,
                   bool ensure_ascii, bool sort_keys);

// UTF-8 helpers: code points, Python str.isspace().
std::u32string DecodeUtf8(const std::string& s);
std::string EncodeUtf8(const std::u32string& s);
bool IsPySpace(char32_t c);
// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other code points are caseless.
char32_t ToUpperCp(char32_t c);
char32_t ToLowerCp(char32_t c);
bool IsCased(char32_t c);
std::string PyUpper(const std::string& s);  // str.upper(), with ß -> SS
std::string PyLower(const std::string& s);  // str.lower()

}  // namespace anchorage::jinja
