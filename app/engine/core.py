"""The reference engine: one model, its LoRA adapters, the prefix cache, and the decode
loop. ``Engine.run`` is called from one worker thread only (see scheduler.py)."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from app.engine import sampling
from app.engine.metrics import EngineMetrics
from app.engine.prefix_cache import PrefixCache


class EngineError(Exception):
    status = 400
    kind = "BadRequestError"


def text_of_parts(parts: list) -> str:
    """OpenAI content parts as text. This engine's models read text only: an image or
    audio part is refused (vLLM refuses them for a text-only model), never dropped, which
    answered a question about a picture without the picture."""
    out = []
    for p in parts:
        kind = p.get("type", "text") if isinstance(p, dict) else None
        if kind != "text":
            raise EngineError(f"content part of type {kind!r} is not supported: this model "
                              "takes text only")
        out.append(str(p.get("text") or ""))
    return "".join(out)


class ModelNotFound(EngineError):
    status = 404
    kind = "NotFoundError"


@dataclass
class Job:
    """One chat completion: what to run, and where its events go.

    ``emit`` receives ("token", delta_text, logprob_entry | None), then exactly one of
    ("done", finish_reason, usage) or ("error", message)."""

    model: str
    prompt_ids: list[int]
    emit: Callable[[tuple], None]
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    response_format: dict | None = None
    cache_salt: str = ""
    ignore_eos: bool = False  # vLLM's extra sampling parameter
    tool_plan: Any = None  # tools.ToolPlan: how the output becomes tool calls
    submitted_at: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, model_path: Path, served_model_name: str, *,
                 max_prefix_tokens: int = 32768, block_size: int = 16,
                 max_model_len: int = 8192, kv_events: Any = None) -> None:
        """``kv_events``: a ``kv_events.CacheEvents`` the prefix cache publishes to."""
        from app.engine.model import load
        self.served_model_name = served_model_name
        self.tokenizer, self.base = load(model_path)
        self.max_model_len = min(max_model_len,
                                 getattr(self.base.config, "max_position_embeddings", max_model_len))
        self.peft = None  # peft.PeftModel once an adapter is loaded
        self.adapters: dict[str, str] = {}  # lora_name -> path
        self.prefix_cache = PrefixCache(max_prefix_tokens, block_size, kv_events)
        if kv_events is not None:
            kv_events.cleared()   # a (re)started engine holds no block of any earlier run
        self.metrics = EngineMetrics(served_model_name)
        self._grammar_compiler = None
        self._grammars: dict[str, Any] = {}
        eos = self.base.generation_config.eos_token_id if self.base.generation_config else None
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        self.stop_token_ids = ids

    # -- prompts ---------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """Prompt ids; ``tools`` (function objects) go to a template that renders them, or
        are written in Hermes form for one that does not (see tools.render_messages)."""
        for m in messages:   # OpenAI content parts: text only, on every path
            if isinstance(m, dict) and isinstance(m.get("content"), list):
                m["content"] = text_of_parts(m["content"])
        if tools is not None or any(m.get("role") == "tool" or m.get("tool_calls")
                                    for m in messages if isinstance(m, dict)):
            from app.engine.tools import render_messages
            if "tools" in (self.tokenizer.chat_template or ""):
                text = self.tokenizer.apply_chat_template(
                    messages, tools=[{"type": "function", "function": f}
                                     for f in tools or []] or None,
                    add_generation_prompt=True, tokenize=False)
                return self.tokenizer.encode(text, add_special_tokens=False)
            messages = render_messages(messages, tools)
        for m in messages:
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise EngineError("each message needs a string 'role'")
            if not isinstance(m.get("content", ""), str):
                raise EngineError("message content must be a string")
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                  tokenize=False)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def model_names(self) -> list[str]:
        return [self.served_model_name, *self.adapters]

    def check_model(self, name: str) -> None:
        if name not in self.model_names():
            raise ModelNotFound(f"The model `{name}` does not exist.")

    # -- LoRA ------------------------------------------------------------------------------
    def load_adapter(self, name: str, path: str) -> None:
        """Called on the worker thread (adapters change the weights every forward uses)."""
        if not name or not path:
            raise EngineError("both 'lora_name' and 'lora_path' must be provided.")
        if name in self.adapters or name == self.served_model_name:
            raise EngineError(f"The lora adapter '{name}' has already been loaded.")
        if not (Path(path) / "adapter_config.json").exists():
            raise EngineError(f"Loading lora {name} failed: no adapter_config.json in {path}")
        from peft import PeftModel
        try:
            if self.peft is None:
                self.peft = PeftModel.from_pretrained(self.base, path, adapter_name=name)
            else:
                self.peft.load_adapter(path, adapter_name=name)
        except Exception as exc:  # noqa: BLE001 - a bad adapter is the caller's error
            raise EngineError(f"Loading lora {name} failed: {exc}") from exc
        self.peft.eval()
        self.adapters[name] = path

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise ModelNotFound(f"The lora adapter '{name}' cannot be found.")
        del self.adapters[name]
        if self.adapters:
            self.peft.delete_adapter(name)
        else:
            self.base = self.peft.unload()
            self.peft = None
        self.prefix_cache.clear()

    # -- structured output -----------------------------------------------------------------
    def grammar_for(self, response_format: dict | None):
        """Compiled xgrammar grammar for an OpenAI ``response_format`` (None for text)."""
        if not response_format or response_format.get("type", "text") == "text":
            return None
        kind = response_format.get("type")
        if kind == "json_object":
            key, schema = "json_object", None
        elif kind == "json_schema":
            spec = response_format.get("json_schema") or {}
            schema = spec.get("schema")
            if not isinstance(schema, dict):
                raise EngineError("response_format.json_schema.schema must be an object")
            key = json.dumps(schema)  # not sorted: xgrammar keeps the properties' order
        elif kind == "grammar":   # vLLM's structured_outputs.grammar (xgrammar EBNF)
            key, schema = "grammar\x00" + str(response_format.get("grammar")), None
        elif kind == "structural_tag":  # free text; a trigger starts a schema (tools.py)
            key, schema = "tag\x00" + json.dumps(response_format), None
        else:
            raise EngineError(f"unsupported response_format type {kind!r}")
        if key not in self._grammars:
            import xgrammar as xgr
            if self._grammar_compiler is None:
                info = xgr.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.base.config.vocab_size,
                    stop_token_ids=sorted(self.stop_token_ids))
                self._grammar_compiler = xgr.GrammarCompiler(info, max_threads=1)
            try:
                if kind == "grammar":
                    grammar = self._grammar_compiler.compile_grammar(response_format["grammar"])
                elif kind == "structural_tag":
                    grammar = self._grammar_compiler.compile_structural_tag(
                        [xgr.StructuralTagItem(**t) for t in response_format["structures"]],
                        response_format["triggers"])
                elif schema is None:
                    grammar = self._grammar_compiler.compile_builtin_json_grammar()
                else:
                    grammar = self._grammar_compiler.compile_json_schema(schema,
                                                                        any_whitespace=False)
                self._grammars[key] = grammar
            except Exception as exc:  # noqa: BLE001 - invalid schema is a client error
                what = "grammar" if kind == "grammar" else "JSON schema"
                raise EngineError(f"invalid {what}: {exc}") from exc
        return self._grammars[key]

    # -- the decode loop -------------------------------------------------------------------
    def _forward(self, model_name: str, input_ids: list[int], past):
        ids = torch.tensor([input_ids], dtype=torch.long)
        if self.peft is None:
            return self.base(input_ids=ids, past_key_values=past, use_cache=True)
        if model_name == self.served_model_name:
            with self.peft.disable_adapter():
                return self.peft(input_ids=ids, past_key_values=past, use_cache=True)
        self.peft.set_adapter(model_name)
        return self.peft(input_ids=ids, past_key_values=past, use_cache=True)

    def _prefill(self, job: Job):
        from transformers import DynamicCache
        namespace = f"{job.model}\x00{job.cache_salt}"
        hit, kv = self.prefix_cache.lookup(namespace, job.prompt_ids)
        past = DynamicCache(ddp_cache_data=kv) if kv else DynamicCache()
        out = self._forward(job.model, job.prompt_ids[hit:], past)
        self.prefix_cache.insert(namespace, job.prompt_ids,
                                 [(layer.keys, layer.values) for layer in past.layers])
        self.metrics.prefix_lookup(len(job.prompt_ids), hit)
        return out.logits[0, -1], past, hit

    def _matcher(self, job: Job):
        grammar = self.grammar_for(job.response_format)
        if grammar is None:
            return None, None
        import xgrammar as xgr
        return (xgr.GrammarMatcher(grammar),
                xgr.allocate_token_bitmask(1, self.base.config.vocab_size))

    @staticmethod
    def _masked(logits: torch.Tensor, matcher, bitmask) -> torch.Tensor:
        """Logits with every token the grammar forbids next set to -inf."""
        if matcher is None:
            return logits
        import xgrammar as xgr
        matcher.fill_next_token_bitmask(bitmask, 0)
        masked = logits.clone().unsqueeze(0)
        xgr.apply_token_bitmask_inplace(masked, bitmask)
        return masked[0]

    def _refuse(self, job: Job) -> str | None:
        if job.model not in self.model_names():
            return f"The model `{job.model}` does not exist."
        if len(job.prompt_ids) + 1 > self.max_model_len:
            return (f"prompt is {len(job.prompt_ids)} tokens; this model's maximum context "
                    f"length is {self.max_model_len}")
        return None

    @torch.inference_mode()
    def run(self, job: Job) -> None:
        """Generate for ``job``, emitting events; errors in the request become an
        ("error", ...) event, anything else propagates (the engine is then broken)."""
        refusal = self._refuse(job)
        if refusal:
            job.emit(("error", refusal))
            return
        matcher, bitmask = self._matcher(job)
        gen = torch.Generator().manual_seed(int(job.seed)) if job.seed is not None else None
        logits, past, cached = self._prefill(job)
        budget = min(job.max_tokens, self.max_model_len - len(job.prompt_ids))
        out_ids: list[int] = []
        text, emitted, finish = "", 0, "length"
        while len(out_ids) < budget:
            if job.cancelled.is_set():
                finish = "abort"
                break
            token = sampling.choose_token(self._masked(logits, matcher, bitmask),
                                          job.temperature, job.top_p, gen)
            if not out_ids:
                self.metrics.first_token(time.monotonic() - job.submitted_at)
            if matcher is not None:
                matcher.accept_token(token)
            if token in self.stop_token_ids and not (job.ignore_eos and matcher is None):
                finish = "stop"
                break
            out_ids.append(token)
            lp = (sampling.logprob_entry(logits, token, job.top_logprobs, self.decode_one)
                  if job.logprobs else None)
            text = self.tokenizer.decode(out_ids, skip_special_tokens=True)
            cut = sampling.find_stop(text, job.stop)
            if cut != -1:
                text = text[:cut]
            done = cut != -1 or (matcher is not None and matcher.is_terminated())
            n = sampling.safe_emit_length(text, job.stop, done)
            job.emit(("token", text[emitted:n], lp))
            emitted = max(emitted, n)
            if done:
                finish = "stop"
                break
            logits = self._forward(job.model, [token], past).logits[0, -1]
        if emitted < len(text):
            job.emit(("token", text[emitted:], None))
        self.metrics.finished(len(job.prompt_ids), len(out_ids), finish,
                              time.monotonic() - job.submitted_at)
        job.emit(("done", finish, {
            "prompt_tokens": len(job.prompt_ids), "completion_tokens": len(out_ids),
            "total_tokens": len(job.prompt_ids) + len(out_ids),
            "prompt_tokens_details": {"cached_tokens": cached}}))
