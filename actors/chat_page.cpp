// The chat page the gateway serves at `/`: one static HTML document, no build step and no CDN. It talks
// to the same OpenAI-compatible endpoints as any client (GET /v1/models, POST /v1/chat/completions with
// stream: true), with the API key the user types (kept in the browser's localStorage). Kept here as a
// raw string so the binary carries it (tests/reference/chat_page.mjs drives it in headless chromium).
#include "actors/gateway.hpp"

namespace troupe::actors {

std::string_view chat_page() {
  static constexpr char page[] = R"troupe_page(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>troupe chat</title>
<style>
  :root { font-family: system-ui, sans-serif; color: #1d1d1f; background: #f5f5f7; }
  body { margin: 0; display: grid; grid-template-columns: 18rem 1fr; height: 100vh; }
  aside { padding: 1rem; background: #fff; border-right: 1px solid #ddd; overflow-y: auto; }
  aside label { display: block; font-size: .8rem; color: #555; margin-top: .8rem; }
  aside input, aside select, aside textarea { width: 100%; box-sizing: border-box; font: inherit; padding: .3rem; }
  aside input[type=checkbox] { width: auto; margin-right: .4rem; }
  #status { font-size: .75rem; color: #a33; min-height: 1em; margin-top: .3rem; }
  main { display: flex; flex-direction: column; height: 100vh; }
  #messages { flex: 1; overflow-y: auto; padding: 1rem 2rem; }
  .msg { max-width: 46rem; margin: .6rem 0; padding: .6rem .9rem; border-radius: .6rem; white-space: pre-wrap; word-wrap: break-word; }
  .msg.user { background: #0a66d8; color: #fff; margin-left: auto; }
  .msg.assistant { background: #fff; border: 1px solid #ddd; }
  .msg.error { background: #fde8e8; border: 1px solid #e0a0a0; }
  .meta { font-size: .75rem; color: #777; margin-top: .3rem; }
  form { display: flex; gap: .5rem; padding: 1rem 2rem; background: #fff; border-top: 1px solid #ddd; }
  form textarea { flex: 1; font: inherit; padding: .5rem; resize: vertical; min-height: 2.5rem; }
  button { font: inherit; padding: .4rem 1rem; }
  h1 { font-size: 1.1rem; margin: 0; }
</style>
</head>
<body>
<aside>
  <h1>troupe chat</h1>
  <label for="api-key">API key</label>
  <input id="api-key" type="password" autocomplete="off" placeholder="sent as Authorization: Bearer">
  <div id="status"></div>
  <label for="model">Model</label>
  <select id="model"></select>
  <label for="system">System prompt</label>
  <textarea id="system" rows="3"></textarea>
  <label for="temperature">Temperature</label>
  <input id="temperature" type="number" min="0" max="2" step="0.1" value="0.7">
  <label for="top-p">Top p</label>
  <input id="top-p" type="number" min="0" max="1" step="0.05" value="1">
  <label for="max-tokens">Max tokens (empty: what the context leaves)</label>
  <input id="max-tokens" type="number" min="1" step="1" value="256">
  <label for="seed">Seed (empty: a fresh one)</label>
  <input id="seed" type="number" step="1">
  <label><input id="json-mode" type="checkbox"> JSON mode (response_format json_object)</label>
  <label><button id="clear" type="button">New conversation</button></label>
</aside>
<main>
  <div id="messages" aria-live="polite"></div>
  <form id="composer">
    <textarea id="input" placeholder="Message (Enter sends, Shift+Enter for a new line)"></textarea>
    <button id="send" type="submit">Send</button>
    <button id="stop" type="button" disabled>Stop</button>
  </form>
</main>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;

$("api-key").value = localStorage.getItem("troupe-api-key") || "";
$("api-key").addEventListener("change", () => { localStorage.setItem("troupe-api-key", $("api-key").value); loadModels(); });

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

function bubble(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

async function loadModels() {
  $("status").textContent = "";
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    if (r.status === 401) { $("status").textContent = $("api-key").value ? "This API key is refused." : "This server needs an API key."; return; }
    if (!r.ok) throw new Error((await r.json()).error?.message || r.statusText);
    const body = await r.json();
    const select = $("model");
    const was = select.value;
    select.innerHTML = "";
    for (const m of body.data) {
      const o = document.createElement("option");
      o.value = o.textContent = m.id;
      select.appendChild(o);
    }
    if (was) select.value = was;
  } catch (e) {
    $("status").textContent = "Could not list models: " + e.message;
  }
}

async function send(text) {
  history.push({ role: "user", content: text });
  bubble("user", text);
  const out = bubble("assistant", "");
  out.dataset.state = "streaming";
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push(...history);
  const body = { model: $("model").value, messages, stream: true, stream_options: { include_usage: true },
                 temperature: Number($("temperature").value), top_p: Number($("top-p").value) };
  if ($("max-tokens").value) body.max_tokens = Number($("max-tokens").value);
  if ($("seed").value) body.seed = Number($("seed").value);
  if ($("json-mode").checked) body.response_format = { type: "json_object" };
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  let text_so_far = "", usage = null, finish = null;
  try {
    const r = await fetch("/v1/chat/completions", { method: "POST", headers: headers(), body: JSON.stringify(body), signal: controller.signal });
    if (!r.ok) throw new Error((await r.json()).error?.message || r.statusText);
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message);
          if (chunk.usage) usage = chunk.usage;
          const choice = chunk.choices && chunk.choices[0];
          if (!choice) continue;
          if (choice.delta && typeof choice.delta.content === "string") {
            text_so_far += choice.delta.content;
            out.textContent = text_so_far;
            $("messages").scrollTop = $("messages").scrollHeight;
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
      }
    }
    history.push({ role: "assistant", content: text_so_far });
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = (finish || "") + (usage ? " · " + usage.completion_tokens + " tokens" : "");
    out.appendChild(meta);
  } catch (e) {
    if (e.name !== "AbortError") { out.className = "msg error"; out.textContent = text_so_far + "\n" + e.message; }
  } finally {
    out.dataset.state = "done";
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("input").value.trim();
  if (!text || controller) return;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) { ev.preventDefault(); $("composer").requestSubmit(); }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("clear").addEventListener("click", () => { history.length = 0; $("messages").innerHTML = ""; });
loadModels();
</script>
</body>
</html>
)troupe_page";
  return {page, sizeof page - 1};
}

}  // namespace troupe::actors
