"""Language-model RL on generated text tasks (docs/lm.md): tasks, the policies, evaluation, reward models.

- ``pgcli.lm.tasks``: the tasks (addition, sort, countdown), rewards, the vocabulary interface, prompt encoding.
- ``pgcli.lm.model``: the ``CausalLM`` interface, TinyGPT, key/value-cache ``generate``, ``completion_logprobs``
  (chunked where the model asks), ``save_policy``/``load_policy``.
- ``pgcli.lm.hf``: any Hugging Face causal LM behind ``CausalLM`` (``model=hf``: LoRA, the adapter-off reference),
  its tokenizer behind the vocabulary interface; ``pgcli.lm.random_hf`` writes a random one offline.
- ``pgcli.lm.load``: the task and the policy of a text run's config (and the weights of an earlier run).
- ``pgcli.lm.evaluation``: held-out greedy accuracy, pass@k, reward, length, a samples table per evaluation.
- ``pgcli.lm.reward_model``: a reward model (the policy's architecture with a scalar head), its scores, pairs and
  held-out evaluation; ``pgcli.lm.pairs``: the preference pairs generated from a task.

The trainers of text tasks live beside the other trainers, in ``pgcli.algo`` (``sft``, ``reward_model``, ``lm_grpo``,
``lm_ppo``, ``lm_agent``); what they receive from ``pgcli.training.build`` is written once, in
``pgcli.algo.lm_base.TextTrainerFactory``.
"""
