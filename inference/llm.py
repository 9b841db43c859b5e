"""Offline Python API shaped like vLLM's: `LLM(model=...).generate(prompts, params)`."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from inference.config import EngineConfig
from inference.core.engine import LLMEngine, PromptType, check_messages
from inference.outputs import RequestOutput
from inference.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "smollm2", config_path: str | None = None, **engine_args: Any):
        self.config = EngineConfig.load(config_path, model=model, **engine_args)
        self.engine = LLMEngine(self.config)

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.config = config
        llm.engine = LLMEngine(config)
        return llm

    def shutdown(self) -> None:
        """Stop the engine's worker processes (tensor parallelism) now rather than when this
        object is garbage-collected or the process exits."""
        self.engine.shutdown()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in input order."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams(max_tokens=self.config.sampling.max_tokens)
        params = ([sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams)
                  else list(sampling_params))
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params: got {len(params)} for {len(prompts)} prompts")
        if priority is not None and len(priority) != len(prompts):
            raise ValueError(f"priority: got {len(priority)} values for {len(prompts)} prompts")
        # Validate everything before scheduling anything.
        reqs = [self.engine.validate(p, sp, priority=priority[i] if priority else 0)
                for i, (p, sp) in enumerate(zip(prompts, params))]
        return self._run(reqs, use_tqdm)

    def chat(self, messages: list[dict[str, str]] | list[list[dict[str, str]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a batch of them."""
        batch = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = []
        for conv in batch:
            check_messages(conv)
            ids = self.engine.tokenizer.apply_chat_template(conv, add_generation_prompt=add_generation_prompt)
            prompts.append({"prompt_token_ids": ids})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run(self, reqs, use_tqdm: bool) -> list[RequestOutput]:
        engine = self.engine
        for req in reqs:
            engine.add_request(req)
        order = {req.request_id: i for i, req in enumerate(reqs)}
        results: list[RequestOutput | None] = [None] * len(reqs)
        bar = tqdm(total=len(reqs), desc="Generating", disable=not use_tqdm)
        try:
            while engine.has_unfinished():
                for state in engine.step():
                    if state.finished and state.request_id in order:
                        results[order[state.request_id]] = state.to_output()
                        bar.update(1)
        except BaseException:
            for req in reqs:                       # leave the engine clean for the next call
                engine.abort_request(req.request_id)
                engine.retire_aborted(req.request_id)
            raise
        finally:
            bar.close()
        return results

