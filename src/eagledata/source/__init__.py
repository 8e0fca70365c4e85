"""Where prompts come from: dataset rows (stable ids) -> messages -> prompt ids -> work items."""
