// Drives the gateway's chat page (GET /) in a real browser: Debian's chromium, headless, through
// puppeteer-core (pinned in tests/reference/package.json; it downloads no browser). Loads the page, types
// the API key, sees the model list, sends a message and watches the answer stream in (the assistant's
// text is sampled while it grows), then sends one in JSON mode; keeps a screenshot.
//
//   node tests/reference/chat_page.mjs --url http://127.0.0.1:PORT/ --api-key KEY --screenshot FILE [--chromium PATH]
//
// Prints ONE JSON object: {models, text, lengths_seen, meta, json_text, json_ok}. Exit 0 when printed,
// 1 when the browser or page failed, 2 on bad usage.
import { createRequire } from 'node:module';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const args = {};
const argv = process.argv.slice(2);
for (let i = 0; i + 1 < argv.length; i += 2) args[argv[i].replace(/^--/, '')] = argv[i + 1];
if (!args.url || !args['api-key'] || !args.screenshot) {
  console.error('usage: node tests/reference/chat_page.mjs --url URL --api-key KEY --screenshot FILE [--chromium PATH]');
  process.exit(2);
}

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..', '..');
const require = createRequire(resolve(root, '.reference', 'package.json'));
const puppeteer = require('puppeteer-core');

async function ask(page, text) {
  const before = await page.$$eval('.msg.assistant', (xs) => xs.length);
  // Every change of the answer's text, recorded by a MutationObserver as the events arrive (the tiny
  // models answer faster than a poll could see).
  await page.evaluate(() => {
    window.__lengths = [];
    // Each textContent assignment adds a fresh text node: its length is the text at that event (the
    // observer's callback may run once for many of them).
    new MutationObserver((records) => {
      for (const r of records) {
        const el = r.target;
        if (!(el instanceof Element) || !el.matches('.msg.assistant') || el !== document.querySelector('.msg.assistant:last-of-type')) continue;
        for (const n of r.addedNodes) if (n.nodeType === Node.TEXT_NODE) window.__lengths.push(n.data.length);
      }
    }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
  });
  await page.type('#input', text);
  await page.click('#send');
  await page.waitForFunction((n) => document.querySelectorAll('.msg.assistant').length > n, { timeout: 30000 }, before);
  await page.waitForFunction(() => {
    const xs = document.querySelectorAll('.msg.assistant');
    return xs[xs.length - 1].dataset.state === 'done';
  }, { timeout: 60000 });
  const lengths = await page.evaluate(() => [...new Set(window.__lengths)]);
  return page.$$eval('.msg.assistant', (xs) => {
    const last = xs[xs.length - 1];
    const meta = last.querySelector('.meta');
    return { text: last.firstChild ? last.firstChild.textContent : '', meta: meta ? meta.textContent : '', cls: last.className };
  }).then((r) => ({ ...r, lengths }));
}

const browser = await puppeteer.launch({
  executablePath: args.chromium || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
try {
  const page = await browser.newPage();
  await page.setViewport({ width: 1100, height: 700 });
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  await page.goto(args.url, { waitUntil: 'load' });
  await page.type('#api-key', args['api-key']);
  await page.$eval('#api-key', (el) => el.dispatchEvent(new Event('change')));
  await page.waitForFunction(() => document.querySelectorAll('#model option').length > 0, { timeout: 30000 });
  const models = await page.$$eval('#model option', (xs) => xs.map((x) => x.value));
  await page.$eval('#max-tokens', (el) => { el.value = '48'; });
  await page.$eval('#seed', (el) => { el.value = '3'; });
  const first = await ask(page, 'w300 w301 w302');
  await page.$eval('#json-mode', (el) => { el.checked = true; });
  await page.$eval('#max-tokens', (el) => { el.value = '64'; });
  const second = await ask(page, 'w310 as JSON');
  let jsonOk = false;
  try { const v = JSON.parse(second.text); jsonOk = v !== null && typeof v === 'object' && !Array.isArray(v); } catch { jsonOk = false; }
  await page.screenshot({ path: args.screenshot, fullPage: true });
  console.log(JSON.stringify({ models, text: first.text, lengths_seen: first.lengths, meta: first.meta, cls: first.cls,
                               json_text: second.text, json_ok: jsonOk, page_errors: errors }));
} finally {
  await browser.close();
}
