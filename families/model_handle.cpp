#include "families/model_handle.hpp"

#include <optional>

namespace troupe::families {

result<load::raw_config, model_error> read_config(const std::filesystem::path& path) {
  std::error_code ec;
  const auto target = std::filesystem::is_directory(path, ec) ? path / "config.json" : path;
  auto cfg = load::raw_config::open(target);
  if (!cfg) return unexpected(model_error{cfg.error()});
  return std::move(*cfg);
}

result<std::shared_ptr<const model_handle>, model_error> model_handle::load(const std::filesystem::path& path, const registry& reg) {
  return load(path, reg, {});
}

result<std::shared_ptr<const model_handle>, model_error> model_handle::load(const std::filesystem::path& path, const registry& reg,
                                                                           const std::filesystem::path& mmproj) {
  // A GGUF file is parsed once: its metadata is the config (its tensors are mapped, not read, until a
  // family builds); a Hugging Face directory's config.json is read before any tensor file is opened.
  std::error_code ec;
  const bool gguf = std::filesystem::is_regular_file(path, ec) && path.extension() == ".gguf";
  std::optional<load::weight_store> store;
  std::optional<load::raw_config> cfg;
  if (gguf) {
    auto s = load::weight_store::open(path);
    if (!s) return unexpected(model_error{s.error()});
    store.emplace(std::move(*s));
    cfg.emplace(load::raw_config::from_gguf(store->gguf()->get()));
  } else {
    auto c = read_config(path);
    if (!c) return unexpected(c.error());
    cfg.emplace(std::move(*c));
  }
  auto family = reg.resolve(*cfg);
  if (!family) return unexpected(model_error{family.error()});
  if (!store) {
    auto s = load::weight_store::open(path);
    if (!s) return unexpected(model_error{s.error()});
    store.emplace(std::move(*s));
  }
  auto m = (*family)->build(*cfg, *store);
  if (!m) return unexpected(m.error());
  auto h = std::shared_ptr<model_handle>(new model_handle(path, *family, std::move(*cfg), std::move(*store), std::move(*m)));
  h->pooling_ = pooling_of(path, h->config_);
  if (!mmproj.empty()) {
    auto v = vision_from_mmproj(mmproj);
    if (!v) return unexpected(v.error());
    h->vision_ = std::make_shared<const vision_tower>(std::move(*v));
  } else if (!gguf && h->config_.has("vision_config")) {
    auto v = vision_from_hf(h->config_, h->store_);
    if (!v) return unexpected(v.error());
    h->vision_ = std::make_shared<const vision_tower>(std::move(*v));
  }
  if (h->vision_ && h->vision_->spec.text_hidden != h->model_->config().hidden)
    return unexpected(model_error{config_error{h->model_->config().family, "projection_dim",
                                               "the vision tower's rows are " + std::to_string(h->vision_->spec.text_hidden) +
                                                   " wide, the text model's " + std::to_string(h->model_->config().hidden)}});
  if (h->pooling_.declared_by == "default" && !h->model_->schema().offers(program::step)) {
    // An encoder that declares no pooling: the mean of its states, as sentence-transformers builds for a
    // BERT checkpoint without modules.json (the decoder default, the last token, means little there).
    h->pooling_.mode = pooling_mode::mean;
    h->pooling_.declared_by = "encoder default";
  }
  // The text codec from the checkpoint's own files: tokenizer.json (and tokenizer_config.json) beside a
  // Hugging Face checkpoint, the tokenizer.ggml.* keys of a GGUF.
  if (auto g = h->store_.gguf()) {
    if (g->get().find_value("tokenizer.ggml.model")) {
      auto codec = text::text_codec::from_gguf(g->get());
      if (codec) h->text_.emplace(std::move(*codec));
      else h->text_problem_ = codec.error().message();
    } else {
      h->text_problem_ = "the GGUF file has no tokenizer.ggml.model key";
    }
  } else if (std::filesystem::exists(path / "tokenizer.json", ec)) {
    auto codec = text::text_codec::open(path);
    if (codec) h->text_.emplace(std::move(*codec));
    else h->text_problem_ = codec.error().message();
  } else {
    h->text_problem_ = "no tokenizer.json beside the checkpoint";
  }
  return std::shared_ptr<const model_handle>(std::move(h));
}

result<std::shared_ptr<const model_handle>, model_error> model_handle::over(result<std::unique_ptr<families::model>, model_error> m) const {
  if (!m) return unexpected(m.error());
  std::shared_ptr<model_handle> h(new model_handle(path_, family_, config_, store_, std::move(*m)));
  h->text_ = text_;
  h->text_problem_ = text_problem_;
  h->pooling_ = pooling_;
  h->vision_ = vision_;
  return std::shared_ptr<const model_handle>(std::move(h));
}

result<std::shared_ptr<const model_handle>, model_error> model_handle::shard(int rank, int size) const { return over(model_->shard(rank, size)); }

result<std::shared_ptr<const model_handle>, model_error> model_handle::expert_parallel() const { return over(model_->expert_parallel()); }

result<std::shared_ptr<const model_handle>, model_error> model_handle::with_kv_type(dtype t) const { return over(model_->with_kv_type(t)); }

result<std::shared_ptr<const model_handle>, model_error> with_kv_type(std::shared_ptr<const model_handle> h, dtype t) {
  if (!h || h->model().kv_type() == t || !h->model().schema().offers(program::step)) return h;
  return h->with_kv_type(t);
}

result<std::shared_ptr<const model_handle>, model_error> with_kv_type(std::shared_ptr<const model_handle> h, std::string_view type_name) {
  const auto t = kv_type_from_name(type_name);
  if (!t)
    return unexpected(model_error{config_error{h ? h->model().config().family : std::string(), "kv_type",
                                               "the KV cache is f32, f16, bf16 or q8_0, not '" + std::string(type_name.substr(0, 32)) + "'"}});
  return with_kv_type(std::move(h), *t);
}

result<std::shared_ptr<const model_handle>, model_error> model_handle::stage(int stage, int stages) const { return over(model_->stage(stage, stages)); }

result<std::shared_ptr<const model_handle>, model_error> model_handle::part(int rank, int tp, int stage, int pp) const {
  std::shared_ptr<const model_handle> s;
  if (tp > 1) {
    auto sh = shard(rank, tp);
    if (!sh) return unexpected(sh.error());
    s = *sh;
  }
  if (pp > 1) return s ? s->stage(stage, pp) : this->stage(stage, pp);
  if (s) return s;
  return unexpected(model_error{config_error{model_->config().family, "parallel", "1 x 1 is the whole model: use the handle itself"}});
}

}  // namespace troupe::families
