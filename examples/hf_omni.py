"""A Transformers model with attn_implementation="omni": a packed interleaved training step, then generation.

    python3 examples/hf_omni.py                # a tiny random Llama (runs on a CPU)
    python3 examples/hf_omni.py PATH_OR_NAME   # any causal LM, from disk or the Hub
"""

import argparse

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import omni_hf  # importing it registers attn_implementation="omni"

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("model", nargs="?", help="a causal LM's directory or Hub name (default: a tiny random Llama)")
args = parser.parse_args()
if args.model is not None:
    model = AutoModelForCausalLM.from_pretrained(args.model, attn_implementation="omni")
else:
    config = LlamaConfig(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="omni")

# Two samples packed into one row: tokens 2..9 of the first stand for an image (they see each other both
# ways), the rest is causal text, and neither sample sees the other. The collator makes the mask inputs.
samples = [{"input_ids": list(range(1, 21)), "modality_spans": [(2, 10)]},
           {"input_ids": list(range(1, 13)), "modality_spans": []}]
batch = omni_hf.OmniCollator(pad_token_id=0, mode="pack", max_length=32)(samples)
loss = model(**batch).loss  # input_ids, labels, position_ids, omni_doc_ids, omni_group_ids
loss.backward()
print(f"packed interleaved batch of shape {tuple(batch['input_ids'].shape)}: loss {loss.item():.3f}")

prompts = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])  # the first one left-padded
generated = model.generate(prompts, attention_mask=(prompts != 0).long(), max_new_tokens=8, do_sample=False,
                           pad_token_id=0)
print("greedy continuations:", generated[:, prompts.shape[1]:].tolist())
