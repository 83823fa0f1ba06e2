// llama.cpp (node-llama-cpp 3.21.1, CPU build) as a reference: evaluates a GGUF on a prompt of token
// ids, then greedily generates N tokens, printing for each generated position one JSON line
// {"token": id, "top": [[id, logprob], ...]} with the top K log-probabilities of the full-vocabulary
// softmax of the raw logits. f32 KV cache and flash attention off, so only f32 rounding differs.
// usage: node llama_logprobs.mjs MODEL.gguf IDS_JSON STEPS TOPK
import {greedy, openModel} from "./llama_common.mjs";

const [modelPath, idsJson, stepsArg, topkArg] = process.argv.slice(2);
const {sequence, close} = await openModel(modelPath);
for (const top of await greedy(sequence, JSON.parse(idsJson), Number(stepsArg), Number(topkArg)))
  process.stdout.write(JSON.stringify({token: top[0][0], top}) + "\n");
await close();
