"""Vision-language serving: chat requests that carry images, gated like text.

The shape of vLLM's own multimodal serving tests (``random-mm`` in
``.buildkite/performance-benchmarks/tests/``): one or two images a request from a 70/30 mix of
256x256 and 1280x720 pixels, 300 text tokens, 40 answer tokens. Each image becomes vision tokens
in the prompt (64 for 256x256 and 1,196 for 1280x720 with Qwen2.5-VL's vision encoder, which
``pytest.ini`` attaches to the simulator's model) and costs the encoder's time, so it lands in
TTFT. Every image is distinct (nothing an engine caches by image content can hit); a server that
answered the text and ignored the images would be caught, not measured as fast.
"""

from pytest_llmperf import Workload, slo

IMAGES = {"count": [1, 2], "sizes": [{"size": "256x256", "weight": 0.7}, {"size": "1280x720", "weight": 0.3}]}


@slo(ttft_p50=0.15, tpot_p50=0.02, error_rate=0.01)
def test_image_chat(llmperf):
    result = llmperf.run(Workload(input_tokens=300, output_tokens=40, rate_rps=6, duration_s=3, warmup_s=0.5,
                                  images=IMAGES))
    s = result.summary
    assert s.images_total >= s.completed  # every request carried at least one image
    assert s.input_tokens_total > 300 * s.completed  # and the server counted its vision tokens


# Text and images in one stream of traffic, each request type with its own SLO (stacked markers):
# the images add the encoder's time and their tokens to TTFT, text requests pay only for sharing
# the batch with them.
@slo(request_type="text", ttft_p50=0.1, tpot_p50=0.02)
@slo(request_type="vision", ttft_p50=0.15, tpot_p50=0.02)
@slo(error_rate=0.01)
def test_text_and_images(llmperf):
    result = llmperf.run(Workload(rate_rps=8, duration_s=3, warmup_s=0.5, output_tokens=40, mix=[
        {"name": "text", "input_tokens": 300, "weight": 2},
        {"name": "vision", "input_tokens": 300, "weight": 1, "images": {"count": 1, "sizes": ["512x512"]}},
    ]))
    by_type = result.summary.by_type
    assert by_type["vision"].images_total == by_type["vision"].completed
    assert by_type["text"].images_total == 0
