"""LoRA rollouts: the distillation flywheel (seed §6.4). Traces of a workflow's frontier
answers become a frozen dataset, a LoRA adapter is trained on the tier-1 base model,
evaluated offline and in shadow, approved by a person who did not request it, and rolled
out in canary steps; a rollback restores the previous adapter."""
