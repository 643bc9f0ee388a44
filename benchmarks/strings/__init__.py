"""String-set constraint benchmarks: static-keras trie automata vs XGrammar and peers."""
