"""The SPADE method: prompts, corpus, memory, episodes and the self-play loop."""
