"""A small VLM trained end to end with omni attention on synthetic shapes questions.

    tokenizer.py   word-level tokenizer over a fixed vocabulary
    data.py        scenes, questions and rendering; the `datasets.Dataset` splits
    model.py       the Fuyu-style VLM: patch projection + a Transformers causal LM
    evaluate.py    held-out answer loss, greedy exact-match accuracy, blind baselines
    report.py      the loss / accuracy plot
    train_vlm.py   the accelerate training script (``python -m training.train_vlm --help``)
"""
