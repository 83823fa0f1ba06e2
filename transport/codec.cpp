#include "transport/codec.hpp"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

#include "transport/schema/troupe.capnp.h"

namespace troupe::transport {

std::string_view name(decode_error_code c) {
  switch (c) {
    case decode_error_code::too_large: return "too_large";
    case decode_error_code::not_words: return "not_words";
    case decode_error_code::malformed: return "malformed";
    case decode_error_code::unknown_kind: return "unknown_kind";
    case decode_error_code::bad_version: return "bad_version";
    case decode_error_code::bad_value: return "bad_value";
  }
  return "unknown";
}

std::string_view name(error_code c) {
  switch (c) {
    case error_code::internal: return "internal";
    case error_code::bad_message: return "bad_message";
    case error_code::invalid_request: return "invalid_request";
    case error_code::unknown_model: return "unknown_model";
    case error_code::overloaded: return "overloaded";
    case error_code::disconnected: return "disconnected";
    case error_code::cancelled: return "cancelled";
    case error_code::unimplemented: return "unimplemented";
    case error_code::no_replica: return "no_replica";
    case error_code::busy: return "busy";
    case error_code::name_taken: return "name_taken";
    case error_code::no_room: return "no_room";
    case error_code::prepare_failed: return "prepare_failed";
    case error_code::no_nodes: return "no_nodes";
    case error_code::bad_options: return "bad_options";
    case error_code::entry_limit: return "entry_limit";
    case error_code::byte_limit: return "byte_limit";
    case error_code::bad_request: return "bad_request";
    case error_code::bad_input: return "bad_input";
    case error_code::incompatible: return "incompatible";
    case error_code::unsupported_feature: return "unsupported_feature";
    case error_code::no_head: return "no_head";
    case error_code::too_long: return "too_long";
    case error_code::pool_too_small: return "pool_too_small";
    case error_code::unknown_sequence: return "unknown_sequence";
    case error_code::program_not_offered: return "program_not_offered";
    case error_code::step_failed: return "step_failed";
    case error_code::unauthenticated: return "unauthenticated";
  }
  return "internal";
}

std::string describe(const error& e) { return std::string(name(e.code)) + ": " + e.message; }

std::optional<error_code> error_code_named(std::string_view n) {
  for (unsigned i = 0; i <= static_cast<unsigned>(last_error_code); ++i)
    if (name(static_cast<error_code>(i)) == n) return static_cast<error_code>(i);
  return std::nullopt;
}

std::string_view name(finish_reason r) {
  switch (r) {
    case finish_reason::running: return "";
    case finish_reason::eos: return "eos";
    case finish_reason::stop_string: return "stop_string";
    case finish_reason::length: return "length";
    case finish_reason::capacity: return "capacity";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::deadline: return "deadline";
    case finish_reason::pool_exhausted: return "pool_exhausted";
    case finish_reason::error: return "error";
  }
  return "error";
}

std::optional<finish_reason> finish_reason_named(std::string_view n) {
  for (unsigned i = 1; i <= static_cast<unsigned>(last_finish_reason); ++i)
    if (name(static_cast<finish_reason>(i)) == n) return static_cast<finish_reason>(i);
  return std::nullopt;
}

std::string_view name(device_kind k) { return k == device_kind::cuda ? "cuda" : "cpu"; }

std::string_view name(replica_state s) {
  switch (s) {
    case replica_state::preparing: return "preparing";
    case replica_state::serving: return "serving";
    case replica_state::draining: return "draining";
    case replica_state::failed: return "failed";
  }
  return "unknown";
}

std::string decode_error::message() const { return "message refused: " + reason + " (" + std::string(name(code)) + ")"; }

std::string_view kind(const message& m) {
  static constexpr std::string_view names[] = {"submit", "chunk", "cancel", "error", "step_batch", "entry", "load",
                                               "hello", "inventory", "deploy", "scale", "stats",
                                               "resolved", "cluster_status"};
  return names[m.index()];
}

namespace {

using namespace troupe::transport::wire;

std::string text(capnp::Text::Reader t) { return std::string(t.cStr(), t.size()); }
std::string bytes(capnp::Data::Reader d) { return std::string(reinterpret_cast<const char*>(d.begin()), d.size()); }
capnp::Data::Reader data_of(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}

template <class T, class L>
void set_list(L builder, const std::vector<T>& v) {
  for (unsigned i = 0; i < v.size(); ++i) builder.set(i, v[i]);
}
template <class T, class R>
std::vector<T> get_list(R reader) {
  std::vector<T> v;
  v.reserve(reader.size());
  for (auto x : reader) v.push_back(static_cast<T>(x));
  return v;
}
std::vector<std::string> get_texts(capnp::List<capnp::Text>::Reader r) {
  std::vector<std::string> v;
  for (auto t : r) v.push_back(text(t));
  return v;
}

// ---- builders ---------------------------------------------------------------------------------------

void put(Sampling::Builder b, const sampling& s) {
  b.setTemperature(s.temperature);
  b.setTopK(s.top_k);
  b.setTopP(s.top_p);
  b.setMinP(s.min_p);
  b.setRepetitionPenalty(s.repetition_penalty);
  b.setPresencePenalty(s.presence_penalty);
  b.setFrequencyPenalty(s.frequency_penalty);
  b.setTopLogprobs(s.top_logprobs);
  b.setSeed(s.seed);
  auto lb = b.initLogitBias(static_cast<unsigned>(s.logit_bias.size()));
  for (unsigned i = 0; i < s.logit_bias.size(); ++i) {
    lb[i].setToken(s.logit_bias[i].first);
    lb[i].setBias(s.logit_bias[i].second);
  }
}

void put(TokenLogprob::Builder b, const token_logprob& t) {
  b.setToken(t.token);
  b.setLogprob(t.logprob);
  auto top = b.initTop(static_cast<unsigned>(t.top.size()));
  for (unsigned i = 0; i < t.top.size(); ++i) {
    top[i].setToken(t.top[i].token);
    top[i].setLogprob(t.top[i].logprob);
  }
}

void put(Stats::Builder b, const stats& s) {
  b.setQueued(s.queued);
  b.setRunning(s.running);
  b.setKvBlocksUsed(s.kv_blocks_used);
  b.setKvBlocksTotal(s.kv_blocks_total);
  b.setTokensPerSecond(s.tokens_per_second);
  b.setJobsDone(s.jobs_done);
  b.setJobsRefused(s.jobs_refused);
  b.setPromptTokens(s.prompt_tokens);
  b.setPrefixHitTokens(s.prefix_hit_tokens);
  b.setDraftTokens(s.draft_tokens);
  b.setAcceptedTokens(s.accepted_tokens);
}

void put(LoadRequest::Builder b, const load_request& l) {
  b.setModel(l.model);
  b.setDevice(l.device);
  b.setShard(l.shard);
  b.setMaxRows(l.max_rows);
  b.setCapacity(l.capacity);
  b.setBlockSize(l.block_size);
  b.setPoolBlocks(l.pool_blocks);
  b.setPrefillChunk(l.prefill_chunk);
  b.setTokenBudget(l.token_budget);
  b.setNoPrefixCache(l.no_prefix_cache);
  b.setNoPreempt(l.no_preempt);
  b.setTensorParallel(l.tensor_parallel);
  b.setPipelineParallel(l.pipeline_parallel);
  b.setAcrossNodes(l.across_nodes);
  b.setWorldRank(l.world_rank);
  b.setGroup(l.group);
  b.setReplicaId(l.replica_id);
  b.setExpertParallel(l.expert_parallel);
  b.setSpeculative(l.speculative);
  b.setDraftModel(l.draft_model);
  b.setDraftTokens(l.draft_tokens);
  b.setKvType(l.kv_type);
  auto ads = b.initAdapters(static_cast<unsigned>(l.adapters.size()));
  for (unsigned i = 0; i < l.adapters.size(); ++i) ads.set(i, l.adapters[i]);
  b.setAdapterSlots(l.adapter_slots);
  b.setMaxAdapterRank(l.max_adapter_rank);
  b.setMmproj(l.mmproj);
}

void put(EntryKey::Builder b, const entry_key& k) {
  b.setProgram(static_cast<Program>(k.program));
  b.setRows(k.rows);
  b.setTokens(k.tokens);
  b.setCapacity(k.capacity);
  b.setKvLayout(static_cast<KvLayout>(k.kv));
  b.setBlockSize(k.block_size);
  b.setPoolBlocks(k.pool_blocks);
  b.setLogits(static_cast<LogitRows>(k.logits));
  b.setHiddenCarry(k.hidden_carry);
  b.setStateRows(k.state_rows);
  auto c = b.initCarried(static_cast<unsigned>(k.carried.size()));
  for (unsigned i = 0; i < k.carried.size(); ++i) c.set(i, k.carried[i]);
}

template <class L>
void put_devices(L b, const std::vector<device>& ds) {
  for (unsigned i = 0; i < ds.size(); ++i) {
    b[i].setName(ds[i].name);
    b[i].setKind(static_cast<DeviceKind>(ds[i].kind));
    b[i].setMemoryBytes(ds[i].memory_bytes);
  }
}

struct body_writer {
  Envelope::Body::Builder body;

  void operator()(const job_submit& m) {
    auto b = body.initSubmit();
    b.setJobId(m.job_id);
    b.setModel(m.model);
    auto p = b.getPrompt();
    if (const auto* t = std::get_if<std::string>(&m.prompt)) {
      p.setText(*t);
    } else if (const auto* ids = std::get_if<std::vector<std::int32_t>>(&m.prompt)) {
      set_list(p.initIds(static_cast<unsigned>(ids->size())), *ids);
    } else {
      const auto& chat = std::get<std::vector<chat_message>>(m.prompt);
      auto c = p.initChat(static_cast<unsigned>(chat.size()));
      for (unsigned i = 0; i < chat.size(); ++i) {
        c[i].setRole(chat[i].role);
        c[i].setContent(chat[i].content);
      }
    }
    put(b.initSampling(), m.sampling);
    auto stop = b.initStop(static_cast<unsigned>(m.stop.size()));
    for (unsigned i = 0; i < m.stop.size(); ++i) stop.set(i, m.stop[i]);
    set_list(b.initStopIds(static_cast<unsigned>(m.stop_ids.size())), m.stop_ids);
    b.setMaxTokens(m.max_tokens);
    b.setIgnoreEos(m.ignore_eos);
    auto in = b.initInputs(static_cast<unsigned>(m.inputs.size()));
    for (unsigned i = 0; i < m.inputs.size(); ++i) {
      in[i].setName(m.inputs[i].name);
      in[i].setDtype(static_cast<DType>(m.inputs[i].dtype));
      set_list(in[i].initShape(static_cast<unsigned>(m.inputs[i].shape.size())), m.inputs[i].shape);
      in[i].setData(data_of(m.inputs[i].data));
      set_list(in[i].initPositions(static_cast<unsigned>(m.inputs[i].positions.size())), m.inputs[i].positions);
    }
    b.setPriority(m.priority);
    b.setDeadlineMs(m.deadline_ms);
    b.setToolsJson(m.tools_json);
    set_list(b.initPriorOutput(static_cast<unsigned>(m.prior_output.size())), m.prior_output);
    b.setEmbed(m.embed);
    b.setNoSpeculation(m.no_speculation);
    b.setBeams(m.beams);
    b.setLengthPenalty(m.length_penalty);
    b.setEarlyStopping(m.early_stopping);
    b.setAdapter(m.adapter);
    auto imgs = b.initImages(static_cast<unsigned>(m.images.size()));
    for (unsigned i = 0; i < m.images.size(); ++i) imgs.set(i, data_of(m.images[i]));
    if (m.guide.kind != guide_kind::none) {
      auto g = b.initGuide();
      g.setKind(static_cast<GuideKind>(m.guide.kind));
      g.setText(m.guide.text);
    }
  }
  void operator()(const token_chunk& m) {
    auto b = body.initChunk();
    b.setJobId(m.job_id);
    set_list(b.initIds(static_cast<unsigned>(m.ids.size())), m.ids);
    b.setText(m.text);
    auto lp = b.initLogprobs(static_cast<unsigned>(m.logprobs.size()));
    for (unsigned i = 0; i < m.logprobs.size(); ++i) put(lp[i], m.logprobs[i]);
    b.setFinishReason(static_cast<FinishReason>(m.finish_reason));
    auto u = b.initUsage();
    u.setPromptTokens(m.usage.prompt_tokens);
    u.setCompletionTokens(m.usage.completion_tokens);
    u.setCachedTokens(m.usage.cached_tokens);
    b.setReplica(m.replica);
    set_list(b.initEmbedding(static_cast<unsigned>(m.embedding.size())), m.embedding);
    auto bs = b.initBeams(static_cast<unsigned>(m.beams.size()));
    for (unsigned i = 0; i < m.beams.size(); ++i) {
      set_list(bs[i].initIds(static_cast<unsigned>(m.beams[i].ids.size())), m.beams[i].ids);
      bs[i].setText(m.beams[i].text);
      bs[i].setLogprob(m.beams[i].logprob);
      bs[i].setScore(m.beams[i].score);
      bs[i].setFinishReason(static_cast<FinishReason>(m.beams[i].finish_reason));
    }
  }
  void operator()(const cancel_job& m) { body.initCancel().setJobId(m.job_id); }
  void operator()(const error& m) {
    auto b = body.initError();
    b.setJobId(m.job_id);
    b.setCode(static_cast<ErrorCode>(m.code));
    b.setMessage(m.message);
    b.setRetry(static_cast<Retry>(m.retry));
  }
  void operator()(const step_batch& m) {
    auto b = body.initStepBatch();
    put(b.initEntry(), m.entry);
    set_list(b.initTokenIds(static_cast<unsigned>(m.token_ids.size())), m.token_ids);
    set_list(b.initPositions(static_cast<unsigned>(m.positions.size())), m.positions);
    set_list(b.initKvWriteMap(static_cast<unsigned>(m.kv_write_map.size())), m.kv_write_map);
    set_list(b.initKvReadMap(static_cast<unsigned>(m.kv_read_map.size())), m.kv_read_map);
    auto rows = b.initRows(static_cast<unsigned>(m.rows.size()));
    for (unsigned i = 0; i < m.rows.size(); ++i) {
      rows[i].setSequence(m.rows[i].sequence);
      rows[i].setDraw(m.rows[i].draw);
      put(rows[i].initSampling(), m.rows[i].sampling);
      rows[i].setWantLogits(m.rows[i].want_logits);
    }
  }
  void operator()(const entry_key& m) { put(body.initEntry(), m); }
  void operator()(const load_request& m) { put(body.initLoad(), m); }
  void operator()(const node_hello& m) {
    auto b = body.initHello();
    b.setNodeId(m.node_id);
    b.setHost(m.host);
    b.setPort(m.port);
    put_devices(b.initDevices(static_cast<unsigned>(m.devices.size())), m.devices);
  }
  void operator()(const inventory& m) {
    auto n = body.initInventory().initNodes(static_cast<unsigned>(m.nodes.size()));
    for (unsigned i = 0; i < m.nodes.size(); ++i) {
      n[i].setNodeId(m.nodes[i].node_id);
      put_devices(n[i].initDevices(static_cast<unsigned>(m.nodes[i].devices.size())), m.nodes[i].devices);
    }
  }
  void operator()(const deploy& m) {
    auto b = body.initDeploy();
    b.setModel(m.model);
    b.setReplicas(m.replicas);
    put(b.initLoad(), m.load);
    b.setGoal(m.goal);
  }
  void operator()(const scale& m) {
    auto b = body.initScale();
    b.setModel(m.model);
    b.setReplicas(m.replicas);
  }
  void operator()(const stats& m) { put(body.initStats(), m); }
  void operator()(const resolved_model& m) {
    auto b = body.initResolved();
    b.setPath(m.path);
    b.setFamily(m.family);
    b.setBytes(m.bytes);
    b.setMaxPositions(m.max_positions);
    b.setLayers(m.layers);
    b.setLayerBytes(m.layer_bytes);
    b.setEmbeddingBytes(m.embedding_bytes);
    b.setHeadBytes(m.head_bytes);
    b.setKvBytesPerTokenPerLayer(m.kv_bytes_per_token_per_layer);
    b.setScratchBytes(m.scratch_bytes);
    b.setHeads(m.heads);
    b.setKvHeads(m.kv_heads);
    b.setPlannable(m.plannable);
    b.setError(m.error);
    b.setExperts(m.experts);
    b.setExpertBytes(m.expert_bytes);
  }
  void operator()(const cluster_status& m) {
    auto b = body.initClusterStatus();
    auto n = b.initNodes(static_cast<unsigned>(m.nodes.size()));
    for (unsigned i = 0; i < m.nodes.size(); ++i) {
      const auto& x = m.nodes[i];
      n[i].setId(x.id);
      put_devices(n[i].initDevices(static_cast<unsigned>(x.devices.size())), x.devices);
      n[i].setState(x.state);
      n[i].setReplicas(x.replicas);
      n[i].setCommittedBytes(x.committed_bytes);
    }
    auto r = b.initReplicas(static_cast<unsigned>(m.replicas.size()));
    for (unsigned i = 0; i < m.replicas.size(); ++i) {
      const auto& x = m.replicas[i];
      r[i].setId(x.id);
      r[i].setModel(x.model);
      auto ns = r[i].initNodes(static_cast<unsigned>(x.nodes.size()));
      for (unsigned k = 0; k < x.nodes.size(); ++k) ns.set(k, x.nodes[k]);
      auto ds = r[i].initDevices(static_cast<unsigned>(x.devices.size()));
      for (unsigned k = 0; k < x.devices.size(); ++k) ds.set(k, x.devices[k]);
      r[i].setState(static_cast<ReplicaState>(x.state));
      r[i].setOutstanding(x.outstanding);
      r[i].setPrepareDone(x.prepare_done);
      r[i].setPrepareTotal(x.prepare_total);
      r[i].setTensorParallel(x.tensor_parallel);
      r[i].setPipelineParallel(x.pipeline_parallel);
    }
    auto d = b.initDeployments(static_cast<unsigned>(m.deployments.size()));
    for (unsigned i = 0; i < m.deployments.size(); ++i) {
      const auto& x = m.deployments[i];
      d[i].setName(x.name);
      d[i].setPath(x.path);
      d[i].setDesired(x.desired);
      d[i].setServing(x.serving);
      d[i].setFamily(x.family);
      d[i].setKvType(x.kv_type);
      d[i].setKvBytesPerToken(x.kv_bytes_per_token);
      d[i].setCapacity(x.capacity);
      d[i].setKvTokens(x.kv_tokens);
      auto ads = d[i].initAdapters(static_cast<unsigned>(x.adapters.size()));
      for (unsigned k = 0; k < x.adapters.size(); ++k) ads.set(k, x.adapters[k]);
    }
    b.setJobs(m.jobs);
    b.setRefused(m.refused);
  }
};

// ---- readers ----------------------------------------------------------------------------------------

struct value_error {
  std::string reason;
};

sampling get(Sampling::Reader r) {
  sampling s;
  s.temperature = r.getTemperature();
  s.top_k = r.getTopK();
  s.top_p = r.getTopP();
  s.min_p = r.getMinP();
  s.repetition_penalty = r.getRepetitionPenalty();
  s.presence_penalty = r.getPresencePenalty();
  s.frequency_penalty = r.getFrequencyPenalty();
  s.top_logprobs = r.getTopLogprobs();
  s.seed = r.getSeed();
  for (auto b : r.getLogitBias()) s.logit_bias.emplace_back(b.getToken(), b.getBias());
  return s;
}

token_logprob get(TokenLogprob::Reader r) {
  token_logprob t;
  t.token = r.getToken();
  t.logprob = r.getLogprob();
  for (auto x : r.getTop()) t.top.push_back({x.getToken(), x.getLogprob()});
  return t;
}

stats get(Stats::Reader r) {
  return {r.getQueued(),   r.getRunning(),     r.getKvBlocksUsed(),  r.getKvBlocksTotal(), r.getTokensPerSecond(),
          r.getJobsDone(), r.getJobsRefused(), r.getPromptTokens(), r.getPrefixHitTokens(), r.getDraftTokens(), r.getAcceptedTokens()};
}

load_request get(LoadRequest::Reader r) {
  return {text(r.getModel()), text(r.getDevice()), text(r.getShard()), r.getMaxRows(), r.getCapacity(), r.getBlockSize(), r.getPoolBlocks(),
          r.getPrefillChunk(), r.getTokenBudget(), r.getNoPrefixCache(), r.getNoPreempt(), r.getTensorParallel(),
          r.getPipelineParallel(), r.getAcrossNodes(), r.getWorldRank(), text(r.getGroup()), r.getReplicaId(), r.getExpertParallel(),
          text(r.getSpeculative()), text(r.getDraftModel()), r.getDraftTokens(), text(r.getKvType()), get_texts(r.getAdapters()),
          r.getAdapterSlots(), r.getMaxAdapterRank(), text(r.getMmproj())};
}

// nullopt: a device kind this build does not know.
std::optional<std::vector<device>> get_devices(capnp::List<Device>::Reader r) {
  std::vector<device> v;
  for (auto d : r) {
    const auto k = static_cast<unsigned>(d.getKind());
    if (k > static_cast<unsigned>(device_kind::cuda)) return std::nullopt;
    v.push_back({text(d.getName()), static_cast<device_kind>(k), d.getMemoryBytes()});
  }
  return v;
}

// nullopt: an enum value this build does not know.
std::optional<entry_key> get(EntryKey::Reader r) {
  entry_key k;
  const auto p = static_cast<unsigned>(r.getProgram()), kv = static_cast<unsigned>(r.getKvLayout()), lr = static_cast<unsigned>(r.getLogits());
  if (p > static_cast<unsigned>(program_kind::encode) || kv > static_cast<unsigned>(kv_layout::paged) || lr > static_cast<unsigned>(logit_rows::all))
    return std::nullopt;
  k.program = static_cast<program_kind>(p);
  k.rows = r.getRows();
  k.tokens = r.getTokens();
  k.capacity = r.getCapacity();
  k.kv = static_cast<kv_layout>(kv);
  k.block_size = r.getBlockSize();
  k.pool_blocks = r.getPoolBlocks();
  k.logits = static_cast<logit_rows>(lr);
  k.hidden_carry = r.getHiddenCarry();
  k.state_rows = r.getStateRows();
  if (k.state_rows < 0) return std::nullopt;  // refused as a malformed key
  k.carried = get_texts(r.getCarried());
  return k;
}

result<message, decode_error> read_body(Envelope::Body::Reader body) {
  auto bad = [](std::string why) { return unexpected(decode_error{decode_error_code::bad_value, std::move(why)}); };
  switch (body.which()) {
    case Envelope::Body::SUBMIT: {
      auto r = body.getSubmit();
      job_submit m;
      m.job_id = r.getJobId();
      m.model = text(r.getModel());
      auto p = r.getPrompt();
      switch (p.which()) {
        case JobSubmit::Prompt::TEXT: m.prompt = text(p.getText()); break;
        case JobSubmit::Prompt::IDS: m.prompt = get_list<std::int32_t>(p.getIds()); break;
        case JobSubmit::Prompt::CHAT: {
          std::vector<chat_message> chat;
          for (auto c : p.getChat()) chat.push_back({text(c.getRole()), text(c.getContent())});
          m.prompt = std::move(chat);
          break;
        }
        default: return unexpected(decode_error{decode_error_code::unknown_kind, "a prompt form this build does not know"});
      }
      m.sampling = get(r.getSampling());
      m.stop = get_texts(r.getStop());
      m.stop_ids = get_list<std::int32_t>(r.getStopIds());
      m.max_tokens = r.getMaxTokens();
      if (m.max_tokens < 0) return bad("max_tokens is negative");
      m.ignore_eos = r.getIgnoreEos();
      for (auto in : r.getInputs()) {
        const auto t = static_cast<unsigned>(in.getDtype());
        if (t >= static_cast<unsigned>(dtype_count)) return bad("an unknown element type " + std::to_string(t));
        m.inputs.push_back({text(in.getName()), static_cast<dtype>(t), get_list<std::int64_t>(in.getShape()), bytes(in.getData()),
                            get_list<std::int64_t>(in.getPositions())});
      }
      m.priority = r.getPriority();
      m.deadline_ms = r.getDeadlineMs();
      if (m.deadline_ms < 0) return bad("deadline_ms is negative");
      m.tools_json = text(r.getToolsJson());
      m.prior_output = get_list<std::int32_t>(r.getPriorOutput());
      m.embed = r.getEmbed();
      m.no_speculation = r.getNoSpeculation();
      m.beams = r.getBeams();
      m.length_penalty = r.getLengthPenalty();
      m.early_stopping = r.getEarlyStopping();
      m.adapter = text(r.getAdapter());
      for (auto img : r.getImages()) m.images.push_back(bytes(img));
      if (r.hasGuide()) {
        const auto g = r.getGuide();
        const auto k = static_cast<unsigned>(g.getKind());
        if (k > static_cast<unsigned>(last_guide_kind)) return bad("an unknown guide kind " + std::to_string(k));
        m.guide = {static_cast<guide_kind>(k), text(g.getText())};
      }
      return m;
    }
    case Envelope::Body::CHUNK: {
      auto r = body.getChunk();
      token_chunk m;
      m.job_id = r.getJobId();
      m.ids = get_list<std::int32_t>(r.getIds());
      m.text = text(r.getText());
      for (auto l : r.getLogprobs()) m.logprobs.push_back(get(l));
      const auto f = static_cast<unsigned>(r.getFinishReason());
      if (f > static_cast<unsigned>(last_finish_reason)) return bad("an unknown finish reason " + std::to_string(f));
      m.finish_reason = static_cast<finish_reason>(f);
      auto u = r.getUsage();
      m.usage = {u.getPromptTokens(), u.getCompletionTokens(), u.getCachedTokens()};
      m.replica = r.getReplica();
      m.embedding = get_list<float>(r.getEmbedding());
      for (auto b : r.getBeams()) {
        const auto bf = static_cast<unsigned>(b.getFinishReason());
        if (bf > static_cast<unsigned>(last_finish_reason)) return bad("an unknown finish reason " + std::to_string(bf));
        m.beams.push_back({get_list<std::int32_t>(b.getIds()), text(b.getText()), b.getLogprob(), b.getScore(), static_cast<finish_reason>(bf)});
      }
      return m;
    }
    case Envelope::Body::CANCEL: return cancel_job{body.getCancel().getJobId()};
    case Envelope::Body::ERROR: {
      auto r = body.getError();
      const auto rt = static_cast<unsigned>(r.getRetry());
      if (rt > static_cast<unsigned>(retry::unimplemented)) return bad("an unknown retry disposition");
      const auto code = static_cast<unsigned>(r.getCode());
      if (code > static_cast<unsigned>(last_error_code)) return bad("an unknown error code " + std::to_string(code));
      return error{r.getJobId(), static_cast<error_code>(code), text(r.getMessage()), static_cast<retry>(rt)};
    }
    case Envelope::Body::STEP_BATCH: {
      auto r = body.getStepBatch();
      step_batch m;
      auto e = get(r.getEntry());
      if (!e) return bad("an entry key with an unknown program, KV layout or logit rows");
      m.entry = std::move(*e);
      m.token_ids = get_list<std::int32_t>(r.getTokenIds());
      m.positions = get_list<std::int32_t>(r.getPositions());
      m.kv_write_map = get_list<std::int32_t>(r.getKvWriteMap());
      m.kv_read_map = get_list<std::int32_t>(r.getKvReadMap());
      for (auto row : r.getRows()) m.rows.push_back({row.getSequence(), row.getDraw(), get(row.getSampling()), row.getWantLogits()});
      return m;
    }
    case Envelope::Body::ENTRY: {
      auto e = get(body.getEntry());
      if (!e) return bad("an entry key with an unknown program, KV layout or logit rows");
      return *e;
    }
    case Envelope::Body::LOAD: return get(body.getLoad());
    case Envelope::Body::HELLO: {
      auto r = body.getHello();
      auto devices = get_devices(r.getDevices());
      if (!devices) return bad("an unknown device kind");
      return node_hello{text(r.getNodeId()), text(r.getHost()), r.getPort(), std::move(*devices)};
    }
    case Envelope::Body::INVENTORY: {
      inventory m;
      for (auto n : body.getInventory().getNodes()) {
        auto devices = get_devices(n.getDevices());
        if (!devices) return bad("an unknown device kind");
        m.nodes.push_back({text(n.getNodeId()), std::move(*devices)});
      }
      return m;
    }
    case Envelope::Body::DEPLOY: {
      auto r = body.getDeploy();
      if (r.getReplicas() < 0) return bad("a negative replica count");
      return deploy{text(r.getModel()), r.getReplicas(), get(r.getLoad()), text(r.getGoal())};
    }
    case Envelope::Body::SCALE: {
      auto r = body.getScale();
      if (r.getReplicas() < 0) return bad("a negative replica count");
      return scale{text(r.getModel()), r.getReplicas()};
    }
    case Envelope::Body::STATS: return get(body.getStats());
    case Envelope::Body::RESOLVED: {
      auto r = body.getResolved();
      resolved_model m;
      m.path = text(r.getPath());
      m.family = text(r.getFamily());
      m.bytes = r.getBytes();
      m.max_positions = r.getMaxPositions();
      m.layers = r.getLayers();
      m.layer_bytes = r.getLayerBytes();
      m.embedding_bytes = r.getEmbeddingBytes();
      m.head_bytes = r.getHeadBytes();
      m.kv_bytes_per_token_per_layer = r.getKvBytesPerTokenPerLayer();
      m.scratch_bytes = r.getScratchBytes();
      m.heads = r.getHeads();
      m.kv_heads = r.getKvHeads();
      m.plannable = r.getPlannable();
      m.experts = r.getExperts();
      m.expert_bytes = r.getExpertBytes();
      m.error = text(r.getError());
      return m;
    }
    case Envelope::Body::CLUSTER_STATUS: {
      auto r = body.getClusterStatus();
      cluster_status m;
      for (auto n : r.getNodes()) {
        auto devices = get_devices(n.getDevices());
        if (!devices) return bad("an unknown device kind");
        m.nodes.push_back({text(n.getId()), std::move(*devices), text(n.getState()), n.getReplicas(), n.getCommittedBytes()});
      }
      for (auto x : r.getReplicas()) {
        const auto st = static_cast<unsigned>(x.getState());
        if (st > static_cast<unsigned>(replica_state::failed)) return bad("an unknown replica state " + std::to_string(st));
        replica_status y;
        y.id = x.getId();
        y.model = text(x.getModel());
        y.nodes = get_texts(x.getNodes());
        y.devices = get_texts(x.getDevices());
        y.state = static_cast<replica_state>(st);
        y.outstanding = x.getOutstanding();
        y.prepare_done = x.getPrepareDone();
        y.prepare_total = x.getPrepareTotal();
        y.tensor_parallel = x.getTensorParallel();
        y.pipeline_parallel = x.getPipelineParallel();
        m.replicas.push_back(std::move(y));
      }
      for (auto d : r.getDeployments())
        m.deployments.push_back({text(d.getName()), text(d.getPath()), d.getDesired(), d.getServing(), text(d.getFamily()),
                                 text(d.getKvType()), d.getKvBytesPerToken(), d.getCapacity(), d.getKvTokens(), get_texts(d.getAdapters())});
      m.jobs = r.getJobs();
      m.refused = r.getRefused();
      return m;
    }
  }
  return unexpected(decode_error{decode_error_code::unknown_kind, "body kind " + std::to_string(static_cast<unsigned>(body.which())) +
                                                                      " is not known to protocol version " + std::to_string(protocol_version)});
}

}  // namespace

std::string encode(const message& m) {
  capnp::MallocMessageBuilder mb;
  auto env = mb.initRoot<Envelope>();
  env.setVersion(protocol_version);
  std::visit(body_writer{env.getBody()}, m);
  const auto words = capnp::messageToFlatArray(mb);
  const auto b = words.asBytes();
  return std::string(reinterpret_cast<const char*>(b.begin()), b.size());
}

result<message, decode_error> decode(std::string_view in, const decode_limits& limits) {
  if (in.size() > limits.max_bytes)
    return unexpected(decode_error{decode_error_code::too_large, std::to_string(in.size()) + " bytes, over the bound of " + std::to_string(limits.max_bytes)});
  if (in.empty() || in.size() % sizeof(capnp::word) != 0)
    return unexpected(decode_error{decode_error_code::not_words, std::to_string(in.size()) + " bytes is not a whole number of 8-byte words"});
  // Cap'n Proto reads words in place: copy into aligned storage.
  auto words = kj::heapArray<capnp::word>(in.size() / sizeof(capnp::word));
  std::memcpy(words.begin(), in.data(), in.size());
  capnp::ReaderOptions opt;
  // Cap'n Proto counts each element of a list of empty structs as one word visited: a traversal bound
  // proportional to the message (our encoder never shares a pointer, so a legitimate message is visited
  // once) keeps a few hundred bytes from decoding into a hundred thousand rows.
  opt.traversalLimitInWords = std::min<std::uint64_t>(limits.traversal_words, 2 * (in.size() / sizeof(capnp::word)) + 64);
  opt.nestingLimit = limits.nesting;
  result<message, decode_error> out = unexpected(decode_error{decode_error_code::malformed, "not decoded"});
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([&] {
    capnp::FlatArrayMessageReader reader(words.asPtr(), opt);
    auto env = reader.getRoot<Envelope>();
    if (env.getVersion() == 0) {
      out = unexpected(decode_error{decode_error_code::bad_version, "version 0"});
      return;
    }
    out = read_body(env.getBody());
  });
  KJ_IF_MAYBE(e, failure) {
    return unexpected(decode_error{decode_error_code::malformed, std::string(e->getDescription().cStr())});
  }
  return out;
}

}  // namespace troupe::transport
