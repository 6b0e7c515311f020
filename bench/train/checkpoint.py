"""Training checkpoints small enough to come back from the GPU machine (files of at most 16 MiB):
ckpt.pt holds the model (f32) and the run's state, ckpt_opt.pt beside it the optimizer with its
moments in bf16 (a relative rounding of 2^-9 on Adam's running averages, far below their own
step-to-step change; torch casts them back to the parameters' dtype on load)."""
import os

import torch


def _opt_path(path):
    return os.path.join(os.path.dirname(path) or ".", "ckpt_opt.pt")


def save(path, model, opt, meta):
    """Write ckpt.pt (model + meta) and ckpt_opt.pt beside it, each through a rename."""
    sd = opt.state_dict()
    small = {k: {n: (v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and v.numel() > 1 else v)
                 for n, v in s.items()} for k, s in sd["state"].items()}
    for obj, target in ((dict(meta, model=model.state_dict()), path),
                        ({"state": small, "param_groups": sd["param_groups"]}, _opt_path(path))):
        torch.save(obj, target + ".tmp")
        os.replace(target + ".tmp", target)


def load(path):
    """(meta with 'model', optimizer state or None when ckpt_opt.pt is missing)."""
    meta = _load(path)
    opt_file = _opt_path(path)
    return meta, (_load(opt_file) if os.path.exists(opt_file) else None)


def _load(path):
    # Our own files hold the run's arguments and history beside the tensors: not weights only
    # (torch >= 2.6 defaults to weights_only=True; 1.13 takes the argument too).
    return torch.load(path, map_location="cpu", weights_only=False)
