"""Models, tokenizers and the weights around them.

    models             load a policy (directory, GGUF, `warm-start`), build tiny models
    tokenization       chat templates as token ids: ChatTokenizer, ConversationBuilder
    logprobs           the one definition of a token's log-probability under the policy
    lora               LoRA adapters through peft
    attention_override run a model with a custom registered attention function
    warm_start         package a trained policy as `warm-start` and evaluate it

Import the modules directly; this package imports nothing itself.
"""
