"""A real CPU training job whose FLOPs per step are known: an MLP of Linear layers.

    python flops_train.py --dims 64,256,128,10 --batch 32 [--step-sleep S] [--loader-sleep S]
                          [--save-every N] [--write-every N] [--stall-every N --stall-s S]
                          [--bf16] [--steps N] [--out DIR]

For Linear layers a step costs 2·B·in·out FLOPs forward and, backward, 2·B·in·out for the
weight's gradient plus 2·B·in·out for the input's gradient where one is needed (not for the first
layer: its input is data). ``analytic_flops`` says it; the job prints it with its pid as one JSON
line once it has stepped once, then trains until killed (or for --steps). It runs under
`gputop run` (the agent comes in with it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def analytic_flops(dims: list[int], batch: int) -> int:
    pairs = list(zip(dims, dims[1:]))
    forward = sum(2 * batch * a * b for a, b in pairs)
    weight_grads = sum(2 * batch * a * b for a, b in pairs)
    input_grads = sum(2 * batch * a * b for a, b in pairs[1:])
    return forward + weight_grads + input_grads


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dims", default="64,256,128,10")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.0,
                        help="host time per step besides the math (a steady pace)")
    parser.add_argument("--loader-sleep", type=float, default=0.0,
                        help="time each batch takes in the DataLoader")
    parser.add_argument("--save-every", type=int, default=0, help="torch.save every N steps")
    parser.add_argument("--write-every", type=int, default=0,
                        help="write (and fsync) 16 MiB to a file every N steps, without torch")
    parser.add_argument("--stall-every", type=int, default=0)
    parser.add_argument("--stall-s", type=float, default=0.5)
    parser.add_argument("--bf16", action="store_true", help="the model and data in bfloat16")
    parser.add_argument("--steps", type=int, default=0, help="0: until killed")
    parser.add_argument("--out", default=None, help="where checkpoints go")
    args = parser.parse_args()

    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    torch.manual_seed(0)
    torch.set_num_threads(1)
    dims = [int(d) for d in args.dims.split(",")]
    dtype = torch.bfloat16 if args.bf16 else torch.float32

    class Batches(Dataset):
        def __len__(self) -> int:
            return 1 << 30

        def __getitem__(self, i: int):
            if args.loader_sleep:
                time.sleep(args.loader_sleep / args.batch)
            return torch.randn(dims[0], dtype=dtype), i % dims[-1]

    layers: list[nn.Module] = []
    for a, b in zip(dims, dims[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1]).to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    loader = DataLoader(Batches(), batch_size=args.batch)
    out = args.out or os.environ.get("TMPDIR", "/tmp")
    step = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x).float(), y)
        opt.zero_grad()
        loss.backward()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        step += 1
        if args.save_every and step % args.save_every == 0:
            torch.save({"model": model.state_dict(), "pad": torch.zeros(4 << 20)},
                       os.path.join(out, f"ckpt-{os.getpid()}.pt"))
        if args.write_every and step % args.write_every == 0:
            with open(os.path.join(out, f"raw-{os.getpid()}.bin"), "wb") as f:
                f.write(os.urandom(16 << 20))
                f.flush()
                os.fsync(f.fileno())
        if args.stall_every and step % args.stall_every == 0:
            time.sleep(args.stall_s)
        opt.step()
        if step == 1:
            print(json.dumps({"pid": os.getpid(), "flops": analytic_flops(dims, args.batch)}),
                  flush=True)
        if args.steps and step >= args.steps:
            break
    return 0


if __name__ == "__main__":
    sys.exit(main())
