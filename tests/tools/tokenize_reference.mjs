// Prints reference token ids from @huggingface/tokenizers as JSON.
// Usage: node tokenize_reference.mjs TOKENIZER_JSON TEXTS_JSON
//   TEXTS_JSON is a file holding a JSON array of strings; stdout is {"ids": [[...], ...]}.
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, textsPath] = process.argv.slice(2);
if (!tokenizerPath || !textsPath) {
  console.error("usage: node tokenize_reference.mjs TOKENIZER_JSON TEXTS_JSON");
  process.exit(2);
}
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")), {});
const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const ids = texts.map((t) => tokenizer.encode(t, { add_special_tokens: false }).ids);
process.stdout.write(JSON.stringify({ ids }) + "\n");
