// Shared by the llama.cpp reference scripts: node-llama-cpp loaded from .reference/, a CPU context with
// an f32 KV cache and flash attention off (so only f32 rounding differs from troupe; the environment
// variable TROUPE_KV_TYPE, e.g. F16 or Q8_0, picks another cache type and turns flash attention on, as
// llama.cpp needs for a quantized V cache; TROUPE_LORA a GGUF LoRA to apply), and the greedy
// loop that yields, per generated position, the top K (id, log-probability) of the raw logits' softmax.
import {createRequire} from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.cwd(), ".reference", "node_modules", "x.js"));
const {getLlama, LlamaLogLevel} = await import(require.resolve("node-llama-cpp"));

export async function openModel(modelPath) {
  const llama = await getLlama({gpu: false, build: "never", logLevel: LlamaLogLevel.error, progressLogs: false});
  const model = await llama.loadModel({modelPath});
  const kv = process.env.TROUPE_KV_TYPE || "F32";
  // TROUPE_LORA: a GGUF LoRA file applied at scale 1 (llama.cpp's --lora).
  const lora = process.env.TROUPE_LORA ? {adapters: [{filePath: process.env.TROUPE_LORA, scale: 1}]} : undefined;
  const context = await model.createContext({
    contextSize: 256, batchSize: 256, threads: 2, flashAttention: kv !== "F32",
    experimentalKvCacheKeyType: kv, experimentalKvCacheValueType: kv, lora,
  });
  const close = async () => {
    await context.dispose();
    await model.dispose();
    await llama.dispose();
  };
  return {model, sequence: context.getSequence(), close};
}

// Evaluates `prompt` (token ids), then feeds back the greedy pick `steps` times (or, given `forced`,
// forced[step] instead: a teacher-forced continuation); returns one [[id, logprob], ...] list of the
// top `topk` per generated position (the pick first).
export async function greedy(sequence, prompt, steps, topk, forced = null) {
  const ask = {generateNext: {token: true, probabilities: true, options: {temperature: 0}}};
  const out = [];
  let input = prompt.map((t, i) => (i === prompt.length - 1 ? [t, ask] : t));
  for (let step = 0; step < steps; ++step) {
    const evaluated = await sequence.controlledEvaluate(input);
    const top = [];
    for (const [id, p] of evaluated[evaluated.length - 1].next.probabilities) {
      top.push([id, Math.log(p)]);
      if (top.length === topk) break;
    }
    out.push(top);
    input = [[forced ? forced[step] : top[0][0], ask]];
  }
  return out;
}
