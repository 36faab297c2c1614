"""Logits of Hugging Face transformers' own Qwen3.5 code on a model folder, in fp32.

The reference tools/device-check.sh compares the GPU and CPU forwards with:
    python3 tools/hf_logits.py MODEL_DIR IDS_OUT LOGITS_OUT [TOKENS]
writes TOKENS ids (default 64, spread over the vocabulary) to IDS_OUT as text and their logits,
float32 [TOKENS, vocab] row-major, to LOGITS_OUT. Exits 3 when this transformers does not know
the architecture.
"""
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM


def main():
    model_dir, ids_out, logits_out = sys.argv[1:4]
    tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 64
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    try:
        config = AutoConfig.from_pretrained(model_dir)
    except Exception as error:  # an architecture this version does not know
        print(f"transformers cannot read {model_dir}/config.json: {error}")
        sys.exit(3)
    vocab = config.vocab_size
    ids = [3 + (i * 2654435761) % (vocab - 16) for i in range(tokens)]
    with open(ids_out, "w") as f:
        f.write(" ".join(str(i) for i in ids) + "\n")
    # fp32 on the CPU: no TF32 products and no fused kernels between us and the reference.
    device = "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.to(device).eval()
    print(f"model class {type(model).__name__} on {device}")
    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device)).logits[0].float().cpu().contiguous()
    logits.numpy().tofile(logits_out)
    print(f"wrote {tokens} x {logits.shape[-1]} logits, rms {logits.pow(2).mean().sqrt().item():.4f}")


if __name__ == "__main__":
    main()
