// Lexer and recursive-descent parser for the Jinja subset used by chat templates.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/template/jinja_ast.h"

namespace anchorage::jinja {

namespace {

constexpr int kMaxNestingDepth = 200;
constexpr int kMaxExprNodes = 20000;

struct Token {
  enum class Type { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };
  Type type;
  std::string text;
  int line = 0;
  int column = 0;
  int64_t int_value = 0;
  double float_value = 0.0;
};

bool IsAsciiSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Strips trailing whitespace as Python's str.rstrip() does for ASCII and common Unicode spaces.
std::string RStripWhitespace(const std::string& s) {
  std::u32string cps = DecodeUtf8(s);
  size_t end = cps.size();
  while (end > 0 && IsPySpace(cps[end - 1])) --end;
  if (end == cps.size()) return s;
  return EncodeUtf8(cps.substr(0, end));
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> Run() {
    size_t pos = 0;
    const size_t n = src_.size();
    while (pos < n) {
      size_t start = FindTagStart(pos);
      if (start == std::string::npos) {
        Emit(Token::Type::kText, src_.substr(pos), pos);
        break;
      }
      std::string text = src_.substr(pos, start - pos);
      char kind = src_[start + 1];
      char mod = start + 2 < n ? src_[start + 2] : '\0';
      if (mod == '-') {
        text = RStripWhitespace(text);
      } else if ((kind == '%' || kind == '#') && mod != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = (l_pos == std::string::npos) ? 0 : l_pos + 1;
        bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if (l_pos > 0 || line_starting) {
          bool only_blank = text.find_first_not_of(" \t", l_pos) == std::string::npos;
          if (only_blank) text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, text, pos);
      size_t p = start + 2;
      if (mod == '-' || mod == '+') ++p;
      if (kind == '#') {
        size_t end = src_.find("#}", p);
        if (end == std::string::npos) Fail("unclosed comment", start);
        char before = end > p ? src_[end - 1] : '\0';
        pos = end + 2;
        if (before == '-') {
          while (pos < n && IsAsciiSpace(src_[pos])) ++pos;
        } else if (before != '+' && pos < n && src_[pos] == '\n') {
          ++pos;
        }
        continue;
      }
      if (kind == '%') {
        size_t after_raw = LexRaw(p, start);
        if (after_raw != std::string::npos) {
          pos = after_raw;
          continue;
        }
      }
      Emit(kind == '%' ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", start);
      pos = LexTag(p, kind == '%', start);
    }
    Emit(Token::Type::kEof, "", n);
    return std::move(tokens_);
  }

 private:
  size_t FindTagStart(size_t pos) const {
    while (true) {
      size_t i = src_.find('{', pos);
      if (i == std::string::npos || i + 1 >= src_.size()) return std::string::npos;
      char c = src_[i + 1];
      if (c == '{' || c == '%' || c == '#') return i;
      pos = i + 1;
    }
  }

  void Position(size_t offset, int* line, int* column) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    size_t index = static_cast<size_t>(it - line_starts_.begin()) - 1;
    *line = static_cast<int>(index) + 1;
    *column = static_cast<int>(offset - line_starts_[index]) + 1;
  }

  [[noreturn]] void Fail(const std::string& message, size_t offset) const {
    int line, column;
    Position(offset, &line, &column);
    throw JinjaError(message, line, column);
  }

  Token& Emit(Token::Type type, std::string text, size_t offset) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    Position(offset, &t.line, &t.column);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  bool At(size_t p, const char* s) const { return src_.compare(p, std::strlen(s), s) == 0; }

  // Matches `\s*name\s*` then an end marker "-%}", "+%}" or "%}" at p; returns the end offset and marker.
  bool MatchKeywordTag(size_t p, const char* name, size_t* end, char* marker) const {
    const size_t n = src_.size();
    while (p < n && IsAsciiSpace(src_[p])) ++p;
    if (!At(p, name)) return false;
    p += std::strlen(name);
    if (p < n && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) return false;
    while (p < n && IsAsciiSpace(src_[p])) ++p;
    if (At(p, "-%}") || At(p, "+%}")) {
      *marker = src_[p];
      *end = p + 3;
      return true;
    }
    if (At(p, "%}")) {
      *marker = '\0';
      *end = p + 2;
      return true;
    }
    return false;
  }

  // Lexes `{% raw %}...{% endraw %}` starting inside the opening tag at p; npos when the tag is not raw.
  size_t LexRaw(size_t p, size_t tag_start) {
    size_t pos;
    char marker;
    if (!MatchKeywordTag(p, "raw", &pos, &marker)) return std::string::npos;
    const size_t n = src_.size();
    if (marker == '-') {
      while (pos < n && IsAsciiSpace(src_[pos])) ++pos;
    }
    size_t search = pos;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) Fail("missing '{% endraw %}'", tag_start);
      size_t q = open + 2;
      char mod = q < n ? src_[q] : '\0';
      if (mod == '-' || mod == '+') ++q;
      size_t end;
      char end_marker;
      if (!MatchKeywordTag(q, "endraw", &end, &end_marker)) {
        search = open + 2;
        continue;
      }
      std::string text = src_.substr(pos, open - pos);
      if (mod == '-') {
        text = RStripWhitespace(text);
      } else if (mod != '+') {
        size_t l_pos = text.rfind('\n');
        l_pos = (l_pos == std::string::npos) ? 0 : l_pos + 1;
        bool line_starting = pos == 0 || src_[pos - 1] == '\n';
        if ((l_pos > 0 || line_starting) && text.find_first_not_of(" \t", l_pos) == std::string::npos) {
          text.resize(l_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, text, pos);
      if (end_marker == '-') {
        while (end < n && IsAsciiSpace(src_[end])) ++end;
      } else if (end_marker != '+' && end < n && src_[end] == '\n') {
        ++end;
      }
      return end;
    }
  }

  // Lexes the inside of a tag from p; returns the position after its end marker.
  size_t LexTag(size_t p, bool is_block, size_t tag_start) {
    const size_t n = src_.size();
    int depth = 0;
    while (true) {
      while (p < n && IsAsciiSpace(src_[p])) ++p;
      if (p >= n)
        Fail(is_block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'",
             tag_start);
      if (depth == 0) {
        const char* end = is_block ? "%}" : "}}";
        if (src_[p] == '-' && At(p + 1, end)) {
          Emit(is_block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", p);
          p += 3;
          while (p < n && IsAsciiSpace(src_[p])) ++p;
          return p;
        }
        if (src_[p] == '+' && is_block && At(p + 1, end)) {
          Emit(Token::Type::kBlockEnd, "", p);
          return p + 3;
        }
        if (At(p, end)) {
          Emit(is_block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", p);
          p += 2;
          if (is_block && p < n && src_[p] == '\n') ++p;
          return p;
        }
      }
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < n && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        Emit(Token::Type::kName, src_.substr(p, q - p), p);
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        p = LexNumber(p);
      } else if (c == '\'' || c == '"') {
        p = LexString(p);
      } else {
        static const char* kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  ".",  ",",  ":",  "|",  "(", ")", "[", "]", "{", "}"};
        const char* match = nullptr;
        for (const char* op : kOps) {
          if (At(p, op)) {
            match = op;
            break;
          }
        }
        if (!match) Fail(std::string("unexpected char '") + c + "'", p);
        std::string op = match;
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") {
          if (depth == 0) Fail("unexpected '" + op + "'", p);
          --depth;
        }
        Emit(Token::Type::kOp, op, p);
        p += op.size();
      }
    }
  }

  size_t LexNumber(size_t p) {
    const size_t n = src_.size();
    size_t q = p;
    bool is_float = false;
    while (q < n && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
    if (q + 1 < n && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
      is_float = true;
      ++q;
      while (q < n && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
    }
    if (q < n && (src_[q] == 'e' || src_[q] == 'E')) {
      size_t r = q + 1;
      if (r < n && (src_[r] == '+' || src_[r] == '-')) ++r;
      if (r < n && std::isdigit(static_cast<unsigned char>(src_[r]))) {
        is_float = true;
        q = r;
        while (q < n && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
      }
    }
    std::string digits;
    for (size_t i = p; i < q; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    if (is_float) {
      Token& t = Emit(Token::Type::kFloat, digits, p);
      t.float_value = std::strtod(digits.c_str(), nullptr);
    } else {
      Token& t = Emit(Token::Type::kInt, digits, p);
      auto res = std::from_chars(digits.data(), digits.data() + digits.size(), t.int_value);
      if (res.ec != std::errc()) Fail("integer literal out of range", p);
    }
    return q;
  }

  size_t LexString(size_t p) {
    const size_t n = src_.size();
    char quote = src_[p];
    std::string value;
    size_t q = p + 1;
    while (true) {
      if (q >= n) Fail("unterminated string literal", p);
      char c = src_[q];
      if (c == quote) break;
      if (c == '\\' && q + 1 < n) {
        char e = src_[q + 1];
        q += 2;
        switch (e) {
          case 'n':
            value += '\n';
            break;
          case 't':
            value += '\t';
            break;
          case 'r':
            value += '\r';
            break;
          case '\\':
            value += '\\';
            break;
          case '\'':
            value += '\'';
            break;
          case '"':
            value += '"';
            break;
          case '0':
            value += '\0';
            break;
          case 'a':
            value += '\a';
            break;
          case 'b':
            value += '\b';
            break;
          case 'f':
            value += '\f';
            break;
          case 'v':
            value += '\v';
            break;
          case '\n':
            break;
          case 'x':
          case 'u':
          case 'U': {
            size_t len = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
            if (q + len > n) Fail("truncated escape in string literal", q);
            char32_t cp = static_cast<char32_t>(std::stoul(src_.substr(q, len), nullptr, 16));
            value += EncodeUtf8(std::u32string(1, cp));
            q += len;
            break;
          }
          default:
            value += '\\';
            value += e;
        }
        continue;
      }
      value += c;
      ++q;
    }
    Emit(Token::Type::kString, value, p);
    return q + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_{0};
  std::vector<Token> tokens_;
};

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  StmtList ParseAll() {
    std::string end;
    StmtList body = ParseBody({}, &end);
    return body;
  }

 private:
  using Type = Token::Type;

  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t k = 1) const { return tokens_[std::min(pos_ + k, tokens_.size() - 1)]; }
  Token Next() {
    Token t = tokens_[pos_];
    if (pos_ + 1 < tokens_.size()) ++pos_;
    return t;
  }
  [[noreturn]] void Fail(const std::string& message, const Token& at) const {
    throw JinjaError(message, at.line, at.column);
  }
  bool IsOp(const char* op) const { return Cur().type == Type::kOp && Cur().text == op; }
  bool IsName(const char* name) const { return Cur().type == Type::kName && Cur().text == name; }
  void ExpectOp(const char* op) {
    if (!IsOp(op)) Fail(std::string("expected '") + op + "', got " + Describe(Cur()), Cur());
    Next();
  }
  std::string ExpectName() {
    if (Cur().type != Type::kName) Fail("expected a name, got " + Describe(Cur()), Cur());
    return Next().text;
  }
  void ExpectBlockEnd() {
    if (Cur().type != Type::kBlockEnd) Fail("expected end of statement block, got " + Describe(Cur()), Cur());
    Next();
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case Type::kBlockEnd:
        return "'%}'";
      case Type::kVarEnd:
        return "'}}'";
      case Type::kEof:
        return "end of template";
      case Type::kText:
        return "template text";
      default:
        return "'" + t.text + "'";
    }
  }

  template <typename T>
  std::shared_ptr<T> Make(typename T::Kind kind, const Token& at) {
    if constexpr (std::is_same_v<T, Expr>) {
      if (++expr_nodes_ > kMaxExprNodes) Fail("expression too large", at);
    }
    auto node = std::make_shared<T>();
    node->kind = kind;
    node->line = at.line;
    node->column = at.column;
    return node;
  }

  struct DepthGuard {
    explicit DepthGuard(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxNestingDepth) parser->Fail("template nesting too deep", parser->Cur());
    }
    ~DepthGuard() { --parser->depth_; }
    Parser* parser;
  };

  // Parses statements until a block tag whose keyword is in `ends` (consumed, returned in *end).
  StmtList ParseBody(const std::set<std::string>& ends, std::string* end) {
    DepthGuard guard(this);
    StmtList out;
    while (true) {
      const Token& t = Cur();
      switch (t.type) {
        case Type::kText: {
          auto s = Make<Stmt>(Stmt::Kind::kText, t);
          s->text = t.text;
          out.push_back(s);
          Next();
          break;
        }
        case Type::kVarBegin: {
          expr_nodes_ = 0;
          Token begin = Next();
          auto s = Make<Stmt>(Stmt::Kind::kOutput, begin);
          s->expr = ParseExpr();
          if (Cur().type != Type::kVarEnd) Fail("expected '}}', got " + Describe(Cur()), Cur());
          Next();
          out.push_back(s);
          break;
        }
        case Type::kBlockBegin: {
          expr_nodes_ = 0;
          Next();
          Token kw = Cur();
          std::string keyword = ExpectName();
          if (ends.count(keyword)) {
            *end = keyword;
            return out;
          }
          out.push_back(ParseStatement(keyword, kw, ends));
          break;
        }
        case Type::kEof: {
          if (!ends.empty()) {
            std::string names;
            for (const auto& e : ends) names += (names.empty() ? "'" : " or '") + e + "'";
            Fail("unexpected end of template, expected " + names, t);
          }
          *end = "";
          return out;
        }
        default:
          Fail("unexpected " + Describe(t), t);
      }
    }
  }

  StmtPtr ParseStatement(const std::string& keyword, const Token& kw, const std::set<std::string>& ends) {
    if (keyword == "if") return ParseIf(kw);
    if (keyword == "for") return ParseFor(kw);
    if (keyword == "set") return ParseSet(kw);
    if (keyword == "macro") return ParseMacro(kw);
    if (keyword == "call") return ParseCallBlock(kw);
    if (keyword == "filter") return ParseFilterBlock(kw);
    if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) Fail("'" + keyword + "' outside of a loop", kw);
      auto s = Make<Stmt>(keyword == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, kw);
      ExpectBlockEnd();
      return s;
    }
    static const std::set<std::string> kClosers = {"endif",  "elif",     "else",    "endfor",
                                                   "endset", "endmacro", "endcall", "endfilter"};
    if (kClosers.count(keyword)) Fail("unexpected '" + keyword + "'", kw);
    Fail("unsupported statement '" + keyword + "'", kw);
  }

  StmtPtr ParseIf(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kIf, kw);
    s->conditions.push_back(ParseExpr(false));
    ExpectBlockEnd();
    std::string end;
    s->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
    while (end == "elif") {
      s->conditions.push_back(ParseExpr(false));
      ExpectBlockEnd();
      s->bodies.push_back(ParseBody({"elif", "else", "endif"}, &end));
    }
    if (end == "else") {
      ExpectBlockEnd();
      s->else_body = ParseBody({"endif"}, &end);
    }
    ExpectBlockEnd();
    return s;
  }

  std::vector<std::string> ParseTargets() {
    std::vector<std::string> names;
    bool paren = IsOp("(");
    if (paren) Next();
    names.push_back(ExpectName());
    while (IsOp(",")) {
      Next();
      if (Cur().type != Type::kName) break;
      names.push_back(ExpectName());
    }
    if (paren) ExpectOp(")");
    return names;
  }

  StmtPtr ParseFor(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kFor, kw);
    s->targets = ParseTargets();
    if (!IsName("in")) Fail("expected 'in', got " + Describe(Cur()), Cur());
    Next();
    s->expr = ParseExpr(false);
    if (IsName("if")) {
      Next();
      s->condition = ParseExpr();
    }
    if (IsName("recursive")) Fail("unsupported: recursive loops", Cur());
    ExpectBlockEnd();
    ++loop_depth_;
    std::string end;
    s->body = ParseBody({"else", "endfor"}, &end);
    --loop_depth_;
    if (end == "else") {
      ExpectBlockEnd();
      s->else_body = ParseBody({"endfor"}, &end);
    }
    ExpectBlockEnd();
    return s;
  }

  StmtPtr ParseSet(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kSet, kw);
    std::string first = ExpectName();
    if (IsOp(".")) {
      Next();
      s->target_object = first;
      s->target_attr = ExpectName();
    } else {
      s->targets.push_back(first);
      while (IsOp(",")) {
        Next();
        s->targets.push_back(ExpectName());
      }
    }
    if (IsOp("=")) {
      Next();
      s->expr = ParseExpr();
      if (IsOp(",")) {
        auto tuple = Make<Expr>(Expr::Kind::kTuple, Cur());
        tuple->items.push_back(s->expr);
        while (IsOp(",")) {
          Next();
          tuple->items.push_back(ParseExpr());
        }
        s->expr = tuple;
      }
      ExpectBlockEnd();
      return s;
    }
    if (!s->target_object.empty() || s->targets.size() != 1) Fail("expected '='", Cur());
    s->kind = Stmt::Kind::kSetBlock;
    while (IsOp("|")) {
      Next();
      s->filters.push_back(ParseFilterCall(nullptr));
    }
    ExpectBlockEnd();
    std::string end;
    s->body = ParseBody({"endset"}, &end);
    ExpectBlockEnd();
    return s;
  }

  void ParseParams(Stmt* s) {
    ExpectOp("(");
    while (!IsOp(")")) {
      s->params.push_back(ExpectName());
      if (IsOp("=")) {
        Next();
        s->defaults.push_back(ParseExpr());
      } else {
        s->defaults.push_back(nullptr);
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  StmtPtr ParseMacro(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kMacro, kw);
    s->name = ExpectName();
    ParseParams(s.get());
    ExpectBlockEnd();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = ParseBody({"endmacro"}, &end);
    loop_depth_ = saved_loops;
    if (Cur().type == Type::kName) Next();  // optional macro name after endmacro
    ExpectBlockEnd();
    return s;
  }

  StmtPtr ParseCallBlock(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kCallBlock, kw);
    if (IsOp("(")) ParseParams(s.get());
    s->expr = ParseExpr();
    if (s->expr->kind != Expr::Kind::kCall) Fail("expected a call after 'call'", kw);
    ExpectBlockEnd();
    int saved_loops = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    s->body = ParseBody({"endcall"}, &end);
    loop_depth_ = saved_loops;
    ExpectBlockEnd();
    return s;
  }

  StmtPtr ParseFilterBlock(const Token& kw) {
    auto s = Make<Stmt>(Stmt::Kind::kFilterBlock, kw);
    s->filters.push_back(ParseFilterCall(nullptr));
    while (IsOp("|")) {
      Next();
      s->filters.push_back(ParseFilterCall(nullptr));
    }
    ExpectBlockEnd();
    std::string end;
    s->body = ParseBody({"endfilter"}, &end);
    ExpectBlockEnd();
    return s;
  }

  // ---- expressions ----

  ExprPtr ParseExpr(bool with_condition = true) {
    DepthGuard guard(this);
    if (!with_condition) return ParseOr();
    Token start = Cur();
    ExprPtr e = ParseOr();
    while (IsName("if")) {
      Next();
      auto c = Make<Expr>(Expr::Kind::kCondition, start);
      ExprPtr cond = ParseOr();
      ExprPtr otherwise;
      if (IsName("else")) {
        Next();
        otherwise = ParseExpr();
      }
      c->items = {e, cond, otherwise};
      e = c;
    }
    return e;
  }

  ExprPtr Binary(const std::string& op, ExprPtr lhs, ExprPtr rhs, const Token& at) {
    auto b = Make<Expr>(Expr::Kind::kBinary, at);
    b->op = op;
    b->items = {std::move(lhs), std::move(rhs)};
    return b;
  }

  ExprPtr ParseOr() {
    ExprPtr e = ParseAnd();
    while (IsName("or")) {
      Token t = Next();
      e = Binary("or", e, ParseAnd(), t);
    }
    return e;
  }

  ExprPtr ParseAnd() {
    ExprPtr e = ParseNot();
    while (IsName("and")) {
      Token t = Next();
      e = Binary("and", e, ParseNot(), t);
    }
    return e;
  }

  ExprPtr ParseNot() {
    if (IsName("not")) {
      DepthGuard guard(this);
      Token t = Next();
      auto u = Make<Expr>(Expr::Kind::kUnary, t);
      u->op = "not";
      u->object = ParseNot();
      return u;
    }
    return ParseCompare();
  }

  ExprPtr ParseCompare() {
    Token start = Cur();
    ExprPtr first = ParseMath1();
    std::shared_ptr<Expr> cmp;
    while (true) {
      std::string op;
      if (Cur().type == Type::kOp && (Cur().text == "==" || Cur().text == "!=" || Cur().text == "<" ||
                                      Cur().text == ">" || Cur().text == "<=" || Cur().text == ">=")) {
        op = Next().text;
      } else if (IsName("in")) {
        Next();
        op = "in";
      } else if (IsName("not") && Peek().type == Type::kName && Peek().text == "in") {
        Next();
        Next();
        op = "notin";
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make<Expr>(Expr::Kind::kCompare, start);
        cmp->object = first;
      }
      cmp->ops.push_back(op);
      cmp->items.push_back(ParseMath1());
    }
    return cmp ? ExprPtr(cmp) : first;
  }

  ExprPtr ParseMath1() {
    ExprPtr e = ParseConcat();
    while (IsOp("+") || IsOp("-")) {
      Token t = Next();
      e = Binary(t.text, e, ParseConcat(), t);
    }
    return e;
  }

  ExprPtr ParseConcat() {
    ExprPtr e = ParseMath2();
    while (IsOp("~")) {
      Token t = Next();
      e = Binary("~", e, ParseMath2(), t);
    }
    return e;
  }

  ExprPtr ParseMath2() {
    ExprPtr e = ParsePow();
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      Token t = Next();
      e = Binary(t.text, e, ParsePow(), t);
    }
    return e;
  }

  ExprPtr ParsePow() {
    ExprPtr e = ParseUnary(true);
    while (IsOp("**")) {
      Token t = Next();
      e = Binary("**", e, ParseUnary(true), t);
    }
    return e;
  }

  ExprPtr ParseUnary(bool with_filter) {
    DepthGuard guard(this);
    ExprPtr e;
    if (IsOp("-") || IsOp("+")) {
      Token t = Next();
      auto u = Make<Expr>(Expr::Kind::kUnary, t);
      u->op = t.text;
      u->object = ParseUnary(false);
      e = u;
    } else {
      e = ParsePrimary();
    }
    e = ParsePostfix(e);
    if (with_filter) e = ParseFilterExpr(e);
    return e;
  }

  ExprPtr Literal(Value v, const Token& at) {
    auto l = Make<Expr>(Expr::Kind::kLiteral, at);
    l->literal = std::move(v);
    return l;
  }

  ExprPtr ParsePrimary() {
    const Token t = Cur();
    switch (t.type) {
      case Type::kName: {
        Next();
        if (t.text == "true" || t.text == "True") return Literal(Value::Bool(true), t);
        if (t.text == "false" || t.text == "False") return Literal(Value::Bool(false), t);
        if (t.text == "none" || t.text == "None") return Literal(Value::None(), t);
        auto n = Make<Expr>(Expr::Kind::kName, t);
        n->name = t.text;
        return n;
      }
      case Type::kString: {
        std::string s = Next().text;
        while (Cur().type == Type::kString) s += Next().text;
        return Literal(Value::String(std::move(s)), t);
      }
      case Type::kInt:
        Next();
        return Literal(Value::Int(t.int_value), t);
      case Type::kFloat:
        Next();
        return Literal(Value::Float(t.float_value), t);
      case Type::kOp:
        if (t.text == "(") {
          Next();
          if (IsOp(")")) {
            Next();
            return Literal(Value::List({}, true), t);
          }
          ExprPtr e = ParseExpr();
          if (IsOp(",")) {
            auto tuple = Make<Expr>(Expr::Kind::kTuple, t);
            tuple->items.push_back(e);
            while (IsOp(",")) {
              Next();
              if (IsOp(")")) break;
              tuple->items.push_back(ParseExpr());
            }
            e = tuple;
          }
          ExpectOp(")");
          return e;
        }
        if (t.text == "[") {
          Next();
          auto list = Make<Expr>(Expr::Kind::kList, t);
          while (!IsOp("]")) {
            list->items.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("]");
          return list;
        }
        if (t.text == "{") {
          Next();
          auto dict = Make<Expr>(Expr::Kind::kDict, t);
          while (!IsOp("}")) {
            dict->items.push_back(ParseExpr());
            ExpectOp(":");
            dict->values.push_back(ParseExpr());
            if (!IsOp(",")) break;
            Next();
          }
          ExpectOp("}");
          return dict;
        }
        break;
      default:
        break;
    }
    Fail("unexpected " + Describe(t), t);
  }

  ExprPtr ParsePostfix(ExprPtr e) {
    while (true) {
      if (IsOp(".")) {
        Token t = Next();
        if (Cur().type == Type::kName) {
          auto a = Make<Expr>(Expr::Kind::kAttr, t);
          a->object = e;
          a->name = Next().text;
          e = a;
        } else if (Cur().type == Type::kInt) {
          auto s = Make<Expr>(Expr::Kind::kSubscript, t);
          s->object = e;
          s->items.push_back(Literal(Value::Int(Cur().int_value), Cur()));
          Next();
          e = s;
        } else {
          Fail("expected an attribute name after '.'", Cur());
        }
      } else if (IsOp("[")) {
        e = ParseSubscript(e);
      } else if (IsOp("(")) {
        e = ParseCall(e);
      } else {
        return e;
      }
    }
  }

  ExprPtr ParseSubscript(ExprPtr obj) {
    Token t = Next();  // '['
    ExprPtr start, stop, step;
    bool is_slice = false;
    if (!IsOp(":")) start = ParseExpr();
    if (IsOp(",")) {  // obj[a, b] subscripts with a tuple
      auto tuple = Make<Expr>(Expr::Kind::kTuple, t);
      tuple->items.push_back(start);
      while (IsOp(",")) {
        Next();
        if (IsOp("]")) break;
        tuple->items.push_back(ParseExpr());
      }
      start = tuple;
    } else if (IsOp(":")) {
      is_slice = true;
      Next();
      if (!IsOp("]") && !IsOp(":")) stop = ParseExpr();
      if (IsOp(":")) {
        Next();
        if (!IsOp("]")) step = ParseExpr();
      }
    }
    ExpectOp("]");
    if (!is_slice) {
      auto s = Make<Expr>(Expr::Kind::kSubscript, t);
      s->object = obj;
      s->items.push_back(start);
      return s;
    }
    auto s = Make<Expr>(Expr::Kind::kSlice, t);
    s->object = obj;
    s->items = {start, stop, step};
    return s;
  }

  void ParseArgs(Expr* call) {
    ExpectOp("(");
    while (!IsOp(")")) {
      if (IsOp("*") || IsOp("**")) Fail("unsupported: *args/**kwargs in calls", Cur());
      if (Cur().type == Type::kName && Peek().type == Type::kOp && Peek().text == "=") {
        std::string key = Next().text;
        Next();
        call->kwargs.emplace_back(key, ParseExpr());
      } else {
        if (!call->kwargs.empty()) Fail("positional argument after keyword argument", Cur());
        call->items.push_back(ParseExpr());
      }
      if (!IsOp(",")) break;
      Next();
    }
    ExpectOp(")");
  }

  ExprPtr ParseCall(ExprPtr callee) {
    auto c = Make<Expr>(Expr::Kind::kCall, Cur());
    c->object = callee;
    ParseArgs(c.get());
    return c;
  }

  ExprPtr ParseFilterCall(ExprPtr obj) {
    Token at = Cur();
    std::string name = ExpectName();
    while (IsOp(".")) {
      Next();
      name += "." + ExpectName();
    }
    if (!IsKnownFilter(name)) Fail("unsupported filter '" + name + "'", at);
    auto f = Make<Expr>(Expr::Kind::kFilter, at);
    f->object = obj;
    f->name = name;
    if (IsOp("(")) ParseArgs(f.get());
    return f;
  }

  ExprPtr ParseFilterExpr(ExprPtr e) {
    while (true) {
      if (IsOp("|")) {
        Next();
        e = ParseFilterCall(e);
      } else if (IsName("is")) {
        Next();
        Token at = Cur();
        auto test = Make<Expr>(Expr::Kind::kTest, at);
        if (IsName("not")) {
          Next();
          test->negated = true;
          at = Cur();
        }
        test->name = ExpectName();
        if (!IsKnownTest(test->name)) Fail("unsupported test '" + test->name + "'", at);
        test->object = e;
        if (IsOp("(")) {
          ParseArgs(test.get());
        } else if ((Cur().type == Type::kName || Cur().type == Type::kString || Cur().type == Type::kInt ||
                    Cur().type == Type::kFloat || IsOp("(") || IsOp("[") || IsOp("{")) &&
                   !IsName("else") && !IsName("or") && !IsName("and")) {
          if (IsName("is")) Fail("You cannot chain multiple tests with is", Cur());
          test->items.push_back(ParsePostfix(ParsePrimary()));
        }
        e = test;
      } else if (IsOp("(")) {
        e = ParseCall(e);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int expr_nodes_ = 0;  // in the current tag; bounds the depth of left-nested chains
};

}  // namespace

bool IsKnownFilter(const std::string& name) {
  static const std::set<std::string> kFilters = {
      "tojson",     "trim",   "length", "count",  "items",    "string",     "list",   "first",   "last", "join",
      "default",    "d",      "upper",  "lower",  "replace",  "int",        "float",  "safe",    "map",  "selectattr",
      "rejectattr", "select", "reject", "unique", "abs",      "capitalize", "title",  "reverse", "sort", "min",
      "max",        "sum",    "round",  "indent", "dictsort", "wordcount",  "center", "attr",    "batch"};
  return kFilters.count(name) > 0;
}

bool IsKnownTest(const std::string& name) {
  static const std::set<std::string> kTests = {
      "defined", "undefined", "none",        "string",   "mapping", "iterable", "number", "sequence",
      "boolean", "true",      "false",       "integer",  "float",   "callable", "lower",  "upper",
      "even",    "odd",       "divisibleby", "eq",       "equalto", "ne",       "gt",     "lt",
      "ge",      "le",        "greaterthan", "lessthan", "in",      "sameas"};
  return kTests.count(name) > 0;
}

StmtList ParseTemplate(const std::string& source) {
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized.push_back(source[i]);
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  Lexer lexer(std::move(normalized));
  Parser parser(lexer.Run());
  return parser.ParseAll();
}

}  // namespace anchorage::jinja
