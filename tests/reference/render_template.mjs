// Renders chat templates with the pinned @huggingface/jinja, as transformers.js's apply_chat_template
// does, for troupe's parity test. Input: JSONL (a file named on the command line, or stdin), one case a
// line: {template, messages, tools, add_generation_prompt, bos_token, eos_token, kwargs, date}.
// Output: one JSON line per case, {"output": text} or {"error": message}.
//
// apply_chat_template passes messages, add_generation_prompt, tools and documents (null when not
// given), the special tokens that are set (non-empty strings), then the extra keyword arguments.
// strftime_now reads the clock, so the clock is fixed to the case's date (UTC, en-US month names).
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

process.env.TZ = "UTC";
const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const jinjaPath = join(root, ".reference", "node_modules", "@huggingface", "jinja", "dist", "index.js");
const { Template } = await import(pathToFileURL(jinjaPath).href);

const RealDate = Date;
let fixedMs = RealDate.parse("2024-07-26T14:05:00Z");
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(fixedMs);
    else super(...args);
  }
  static now() {
    return fixedMs;
  }
};
const RealDateTimeFormat = Intl.DateTimeFormat;
Intl.DateTimeFormat = function (locale, options) {
  return new RealDateTimeFormat(locale ?? "en-US", { ...options, timeZone: "UTC" });
};

const input = readFileSync(process.argv[2] ?? 0, "utf8");
const compiled = new Map();
const out = [];
for (const line of input.split("\n")) {
  if (line.trim() === "") continue;
  const c = JSON.parse(line);
  fixedMs = RealDate.parse(c.date ?? "2024-07-26T14:05:00Z");
  let result;
  try {
    let template = compiled.get(c.template);
    if (template === undefined) {
      template = new Template(c.template);
      compiled.set(c.template, template);
    }
    const context = {
      messages: c.messages ?? [],
      add_generation_prompt: c.add_generation_prompt ?? false,
      tools: c.tools ?? null,
      documents: null,
    };
    if (c.bos_token) context.bos_token = c.bos_token;
    if (c.eos_token) context.eos_token = c.eos_token;
    Object.assign(context, c.kwargs ?? {});
    // What a JavaScript caller would write out: lone surrogates become U+FFFD in UTF-8.
    result = { output: Buffer.from(template.render(context), "utf8").toString("utf8") };
  } catch (e) {
    result = { error: String(e?.message ?? e) };
  }
  out.push(JSON.stringify(result));
}
process.stdout.write(out.join("\n") + (out.length > 0 ? "\n" : ""));
