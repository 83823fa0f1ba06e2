// llama.cpp (node-llama-cpp 3.21.1, CPU build) as a reference: evaluates a GGUF on a prompt of token
// ids, then greedily generates N tokens, printing for each generated position one JSON line
// {"token": id, "top": [[id, logprob], ...]} with the top K log-probabilities of the full-vocabulary
// softmax of the raw logits. f32 KV cache and flash attention off, so only f32 rounding differs.
// With FORCED_JSON (a list of STEPS ids), position i + 1 is fed forced[i] rather than the greedy pick.
// usage: node llama_logprobs.mjs MODEL.gguf IDS_JSON STEPS TOPK [FORCED_JSON]
import {greedy, openModel} from "./llama_common.mjs";

const [modelPath, idsJson, stepsArg, topkArg, forcedJson] = process.argv.slice(2);
const {sequence, close} = await openModel(modelPath);
for (const top of await greedy(sequence, JSON.parse(idsJson), Number(stepsArg), Number(topkArg), forcedJson ? JSON.parse(forcedJson) : null))
  process.stdout.write(JSON.stringify({token: top[0][0], top}) + "\n");
await close();
