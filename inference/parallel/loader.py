"""Load one tensor-parallel rank's shard of a model (inference/loader/model_loader.py's steps with
the transform in between):

    plan -> plain weights -> shard_model -> quantization -> install_parallel_layers -> kernels

Random-weight models are built on `meta`, sharded there, and filled by replaying the full
model's random draws one parameter at a time and keeping the rank's slice: the shards are exactly
those of the unsharded model's weights (TP=N equals TP=1), and no rank ever holds the whole model
(a 70B shape at TP 8). Checkpoints are loaded whole on the rank's device, then sliced (fine to
~13B per GPU; sharded reading of big checkpoints is not written yet).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from inference.config import ModelConfig
from inference.loader.model_loader import (
    LoadedModel,
    LoadPlan,
    apply_kernel_transforms,
    apply_weight_transforms,
    load_plain_model,
    load_tokenizer,
    plan_load,
)
from inference.loader.weights import build_model, fill_random_
from inference.models.llama import LlamaForCausalLM, RotaryEmbedding
from inference.parallel.comm import TPComm
from inference.parallel.tp_transform import (
    TPPlan,
    install_parallel_layers,
    shard_model,
    shard_param,
)


def rank_device(config: ModelConfig, rank: int) -> str:
    """Rank r runs on cuda:r (config.device 'cuda' / 'cuda:0'), or on the CPU."""
    return f"cuda:{rank}" if config.device.startswith("cuda") else config.device


def load_rank_model(config: ModelConfig, plan: TPPlan, comm: TPComm | None,
                    load: LoadPlan | None = None) -> LoadedModel:
    """Rank plan.rank's LoadedModel: sharded weights, the shard's arch (KV heads), the global
    vocabulary. comm None: phase 2 (communication) is left to the caller."""
    config = dataclasses.replace(config, device=rank_device(config, plan.rank))
    load = plan_load(config) if load is None else dataclasses.replace(load, device=torch.device(config.device))
    if load.model_dir is None:
        model = _random_shard(load, plan, config.seed)
    else:
        model = load_plain_model(load, config)
        shard_model(model, plan)
    apply_weight_transforms(model, config)
    if comm is not None:
        install_parallel_layers(model, plan, comm)
    apply_kernel_transforms(model, load.dtype, load.device)
    return LoadedModel(model, plan.local_arch(), load_tokenizer(load, config), load.max_model_len, load.dtype,
                       config.model)


@torch.no_grad()
def _random_shard(load: LoadPlan, plan: TPPlan, seed: int) -> LlamaForCausalLM:
    model = build_model(load.arch, load.max_model_len, load.dtype, torch.device("meta"))
    full_shapes = [(name, p.shape) for name, p in model.named_parameters()]    # init_random_weights' order
    shard_model(model, plan)
    device, dtype = load.device, load.dtype
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                module._parameters[name] = nn.Parameter(torch.empty(param.shape, dtype=dtype, device=device),
                                                        requires_grad=False)
    params = dict(model.named_parameters())
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, shape in full_shapes:
        full = torch.empty(shape, dtype=dtype, device=device)
        fill_random_(name, full, gen)
        params[name].data.copy_(shard_param(name, full, plan))
        del full
    model.rotary = RotaryEmbedding(load.arch, load.max_model_len).to(device)
    return model.eval()

