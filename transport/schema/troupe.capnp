@0xbc307882ed7045a1;
# Every message that may cross a process between troupe actors. One Envelope per CAF message, carried
# as bytes. Versioned: `version` is the sender's protocol version; a reader accepts any version from
# 1 up (fields it does not know are ignored, as Cap'n Proto does) and refuses an envelope whose body
# kind it does not know with the `unimplemented` disposition.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::transport::wire");

struct Envelope {
  version @0 :UInt32;
  body :union {
    submit @1 :JobSubmit;
    chunk @2 :TokenChunk;
    cancel @3 :CancelJob;
    error @4 :Error;
    stepBatch @5 :StepBatch;
    entry @6 :EntryKey;
    load @7 :LoadRequest;
    hello @8 :NodeHello;
    inventory @9 :Inventory;
    deploy @10 :Deploy;
    scale @11 :Scale;
    stats @12 :Stats;
    resolved @13 :ResolvedModel;
    clusterStatus @14 :ClusterStatus;
  }
}

# ---- jobs ---------------------------------------------------------------------------------------------

struct LogitBias {
  token @0 :Int32;
  bias @1 :Float32;
}

struct Sampling {
  temperature @0 :Float32;
  topK @1 :Int32;
  topP @2 :Float32 = 1.0;
  minP @3 :Float32;
  repetitionPenalty @4 :Float32 = 1.0;
  presencePenalty @5 :Float32;
  frequencyPenalty @6 :Float32;
  topLogprobs @7 :Int32;
  seed @8 :UInt64;
  logitBias @9 :List(LogitBias);
}

struct ChatMessage {
  role @0 :Text;
  content @1 :Text;
}

# engine/core/dtype.hpp's element types, in its order.
enum DType {
  f64 @0; f32 @1; f16 @2; bf16 @3; fp8E4m3 @4; fp8E5m2 @5;
  i64 @6; i32 @7; i16 @8; i8 @9; u8 @10; boolean @11;
  q40 @12; q41 @13; q50 @14; q51 @15; q80 @16; q81 @17;
  q2K @18; q3K @19; q4K @20; q5K @21; q6K @22; q8K @23;
  mxfp4 @24;
}

struct RequestInput {
  name @0 :Text;
  dtype @1 :DType;
  shape @2 :List(Int64);      # [n, width...]
  data @3 :Data;              # little-endian elements, row-major
  positions @4 :List(Int64);  # empty: dense
}

struct JobSubmit {
  jobId @0 :UInt64;
  model @1 :Text;
  prompt :union {
    text @2 :Text;
    ids @3 :List(Int32);
    chat @4 :List(ChatMessage);
  }
  sampling @5 :Sampling;
  stop @6 :List(Text);
  stopIds @7 :List(Int32);
  maxTokens @8 :Int64 = 16;
  ignoreEos @9 :Bool;
  inputs @10 :List(RequestInput);
  priority @11 :Int32;
  deadlineMs @12 :Int64;      # milliseconds from submission; 0: none
  toolsJson @13 :Text;        # a JSON array of tool schemas for the chat template; empty: none
  priorOutput @14 :List(Int32);  # output already delivered (a job resumed after its replica was lost)
  guide @15 :Guide;           # a constrained output; kind none: free text
  embed @16 :Bool;            # an embedding of the prompt (the encode program, pooled), not a generation
  noSpeculation @17 :Bool;    # decode without the replica's draft policy (the request's opt-out)
  beams @18 :Int32;           # > 1: a beam search of that width
  lengthPenalty @19 :Float32 = 1.0;  # beams ranked by logprob / length^lengthPenalty
  earlyStopping @20 :Bool;    # end the search once `beams` hypotheses are in
  adapter @21 :Text;          # a LoRA adapter the replica has loaded, by name; empty: the base model
  images @22 :List(Data);     # encoded images (PNG, JPEG, ...), one per media marker of the prompt, in order
}

# engine/guide/spec.hpp's kinds, in its order.
enum GuideKind { none @0; jsonObject @1; jsonSchema @2; regex @3; grammar @4; choice @5; }

struct Guide {
  kind @0 :GuideKind;
  text @1 :Text;              # the schema, pattern, GBNF or a JSON array of choices
}

struct TopLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
}

struct TokenLogprob {
  token @0 :Int32;
  logprob @1 :Float32;
  top @2 :List(TopLogprob);
}

struct Usage {
  promptTokens @0 :Int64;
  completionTokens @1 :Int64;
  cachedTokens @2 :Int64;
}

enum FinishReason {
  running @0;                 # not finished: more chunks follow
  eos @1;                     # the model's end-of-generation id (or a request stop id)
  stopString @2;
  length @3;                  # max tokens reached
  capacity @4;                # the sequence filled its capacity
  cancelled @5;
  deadline @6;                # cancelled by its deadline
  poolExhausted @7;
  error @8;                   # a step failed
}

struct TokenChunk {
  jobId @0 :UInt64;
  ids @1 :List(Int32);
  text @2 :Text;
  logprobs @3 :List(TokenLogprob);
  finishReason @4 :FinishReason;
  usage @5 :Usage;
  replica @6 :UInt64;         # the replica that produced it (0: not said)
  embedding @7 :List(Float32);  # an embed job's vector (with its finish)
  beams @8 :List(Beam);         # a beam search's hypotheses (with its finish), best first
}

struct Beam {
  ids @0 :List(Int32);
  text @1 :Text;
  logprob @2 :Float64;
  score @3 :Float64;
  finishReason @4 :FinishReason;
}

struct CancelJob {
  jobId @0 :UInt64;
}

enum Retry {
  failed @0;         # do not retry: the request itself is refused
  overloaded @1;     # retry later or elsewhere
  disconnected @2;   # the peer went away; the job may be resumed
  unimplemented @3;  # the receiver does not know this message
}

enum ErrorCode {
  # the union of the layers' codes: the wire's (bad_message ...), the coordinator's (no_replica ...) and
  # the driver's (bad_options ...); transport/messages.hpp names each
  internal @0;
  badMessage @1;
  invalidRequest @2;
  unknownModel @3;
  overloaded @4;
  disconnected @5;
  cancelled @6;
  unimplemented @7;
  noReplica @8;
  busy @9;
  nameTaken @10;
  noRoom @11;
  prepareFailed @12;
  noNodes @13;
  badOptions @14;
  entryLimit @15;
  byteLimit @16;
  badRequest @17;
  badInput @18;
  incompatible @19;
  unsupportedFeature @20;
  noHead @21;
  tooLong @22;
  poolTooSmall @23;
  unknownSequence @24;
  programNotOffered @25;
  stepFailed @26;
  unauthenticated @27;
}

struct Error {
  jobId @0 :UInt64;
  code @1 :ErrorCode;
  message @2 :Text;
  retry @3 :Retry;
}

# ---- driver and executors ---------------------------------------------------------------------------

struct SampleRow {
  sequence @0 :UInt64;
  draw @1 :UInt64;
  sampling @2 :Sampling;
  wantLogits @3 :Bool;
}

enum Program {
  step @0;
  encode @1;
}

enum KvLayout {
  contiguous @0;
  paged @1;
}

enum LogitRows {
  last @0;
  all @1;
}

# An entry's key as a remote rank compiles it (program, step shape, carried inputs; the head is not part
# of the traced graph a rank runs).
struct EntryKey {
  program @0 :Program;
  rows @1 :Int64;
  tokens @2 :Int64;
  capacity @3 :Int64;
  kvLayout @4 :KvLayout;
  blockSize @5 :Int64;
  poolBlocks @6 :Int64;
  logits @7 :LogitRows;
  hiddenCarry @8 :Bool;
  carried @9 :List(Text);
  stateRows @10 :Int64;          # rows of each recurrent state pool (0: the rows)
}

struct StepBatch {
  entry @0 :EntryKey;
  tokenIds @1 :List(Int32);
  positions @2 :List(Int32);
  kvWriteMap @3 :List(Int32);
  kvReadMap @4 :List(Int32);  # rows x capacity, row-major
  rows @5 :List(SampleRow);
}

struct LoadRequest {
  model @0 :Text;
  device @1 :Text;            # "cpu:0", "cuda:3"
  shard @2 :Text;             # the shard spec; empty: the whole model
  maxRows @3 :Int64;
  capacity @4 :Int64;
  blockSize @5 :Int64;
  poolBlocks @6 :Int64;
  prefillChunk @7 :Int64;
  tokenBudget @8 :Int64;
  noPrefixCache @9 :Bool;
  noPreempt @10 :Bool;
  tensorParallel @11 :Int32;  # ranks of the replica on the node's devices; 0 or 1: one
  pipelineParallel @12 :Int32;  # stages of the replica, each tensorParallel ranks; 0 or 1: one
  acrossNodes @13 :Bool;        # each pipeline stage on a node of its own (the ranks meet through the coordinator)
  worldRank @14 :Int32;         # a remote rank's place in the replica (stage x tensorParallel + rank)
  group @15 :Text;              # the replica's rendezvous prefix, fresh per replica
  replicaId @16 :UInt64;        # the coordinator's id of the replica this load starts (its reports name it)
  expertParallel @17 :Bool;     # the tensorParallel ranks hold whole experts rather than slices of each
  speculative @18 :Text;        # speculative decoding: "" none, "ngram", "model" (draftModel), "mtp"
  draftModel @19 :Text;         # the draft checkpoint, a path on the node
  draftTokens @20 :Int32;       # drafts per verify window; 0: the driver's default
  kvType @21 :Text;             # the KV cache's element type: f32, f16, bf16, q8_0; empty: f16
  adapters @22 :List(Text);     # LoRA adapters every replica loads, "name=path" (a PEFT directory on the node)
  adapterSlots @23 :Int32;      # adapters resident at once; 0: as many as listed (at least 1 when any are)
  maxAdapterRank @24 :Int32;    # the largest adapter rank served; 0: 16
  mmproj @25 :Text;             # a vision tower (llama.cpp's mmproj GGUF) on the node beside a GGUF model; empty: none
}

# ---- nodes and the cluster --------------------------------------------------------------------------

enum DeviceKind {
  cpu @0;
  cuda @1;
}

struct Device {
  name @0 :Text;              # "cpu:0"
  kind @1 :DeviceKind;
  memoryBytes @2 :UInt64;
}

struct NodeHello {
  nodeId @0 :Text;
  host @1 :Text;
  port @2 :UInt16;
  devices @3 :List(Device);
}

struct NodeInventory {
  nodeId @0 :Text;
  devices @1 :List(Device);
}

struct Inventory {
  nodes @0 :List(NodeInventory);
}

struct Deploy {
  model @0 :Text;               # the served name (jobs name it); load.model is the checkpoint's path
  replicas @1 :Int32;           # the desired count
  load @2 :LoadRequest;
  goal @3 :Text;                # the placement planner's objective: latency (default), capacity, throughput
}

struct Scale {
  model @0 :Text;
  replicas @1 :Int32;
}

struct Stats {
  queued @0 :Int64;
  running @1 :Int64;
  kvBlocksUsed @2 :Int64;
  kvBlocksTotal @3 :Int64;
  tokensPerSecond @4 :Float64;
  jobsDone @5 :Int64;
  jobsRefused @6 :Int64;
  promptTokens @7 :Int64;     # prompt tokens admitted
  prefixHitTokens @8 :Int64;  # of those, served from the prefix cache
  draftTokens @9 :Int64;      # speculative decoding: drafts verified
  acceptedTokens @10 :Int64;  # of those, accepted
}

# ---- the registry's answer and the cluster's status ---------------------------------------------------

# A checkpoint resolved by the registry actor: its family and what one replica needs (placement's
# requirements, bytes at the stored dtypes, KV in f32). `error` non-empty: refused, and why.
struct ResolvedModel {
  path @0 :Text;
  family @1 :Text;
  bytes @2 :UInt64;
  maxPositions @3 :Int64;
  layers @4 :Int32;
  layerBytes @5 :UInt64;
  embeddingBytes @6 :UInt64;
  headBytes @7 :UInt64;
  kvBytesPerTokenPerLayer @8 :UInt64;
  scratchBytes @9 :UInt64;
  heads @10 :Int32;
  kvHeads @11 :Int32;
  plannable @12 :Bool;          # the requirements are known (dense decoders)
  error @13 :Text;
  experts @14 :Int32;           # routed experts per layer (0: a dense model)
  expertBytes @15 :UInt64;      # one routed expert's weights in one layer (part of layerBytes)
}

enum ReplicaState {
  preparing @0;
  serving @1;
  draining @2;
  failed @3;
}

struct NodeStatus {
  id @0 :Text;
  devices @1 :List(Device);
  state @2 :Text;               # joining (devices not yet declared), ready, draining
  replicas @3 :Int32;
  committedBytes @4 :UInt64;    # device memory the coordinator placed on the node
}

struct ReplicaStatus {
  id @0 :UInt64;
  model @1 :Text;
  nodes @2 :List(Text);         # its stages' nodes, in pipeline order (the driver on the last)
  devices @3 :List(Text);
  state @4 :ReplicaState;
  outstanding @5 :Int64;
  prepareDone @6 :Int64;
  prepareTotal @7 :Int64;
  tensorParallel @8 :Int32;
  pipelineParallel @9 :Int32;
}

struct DeploymentStatus {
  name @0 :Text;
  path @1 :Text;
  desired @2 :Int32;
  serving @3 :Int32;
  family @4 :Text;
  kvType @5 :Text;              # the replicas' KV cache element type
  kvBytesPerToken @6 :Int64;    # over every layer, at that type
  capacity @7 :Int64;           # positions per sequence
  kvTokens @8 :Int64;           # tokens a replica's KV pool holds
  adapters @9 :List(Text);      # the LoRA adapters its replicas load, by name
}

struct ClusterStatus {
  nodes @0 :List(NodeStatus);
  replicas @1 :List(ReplicaStatus);
  deployments @2 :List(DeploymentStatus);
  jobs @3 :Int64;
  refused @4 :Int64;
}
