"""Image references to PIL images under the media policy: data URLs, local files, fetching."""

from __future__ import annotations

import base64
import http.server
import io
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mlxcel_vision.inputs import ImageInputError, MediaPolicy, decode_image, read_image_file

from red_images import RED, SIZE, data_url, encode, red_data_url, red_image

OPEN = MediaPolicy()


def rgb(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


@pytest.mark.parametrize("image_format", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_of_every_format_give_the_same_red_pixels(image_format):
    image = decode_image(red_data_url(image_format), OPEN, number=1)

    assert image.size == (SIZE, SIZE)
    pixels = rgb(image)
    # JPEG and lossy WebP shift a solid colour by a few levels at most.
    tolerance = 0 if image_format in ("PNG", "GIF") else 8
    assert np.abs(pixels - np.array(RED, dtype=np.int16)).max() <= tolerance


def test_a_gif_gives_its_first_frame():
    frames = [Image.new("RGB", (8, 8), RED), Image.new("RGB", (8, 8), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:])
    image = decode_image(data_url(buffer.getvalue(), "image/gif"), OPEN, number=1)

    assert tuple(rgb(image)[0, 0]) == RED


def test_a_jpeg_is_turned_upright_as_its_exif_orientation_says():
    wide = Image.new("RGB", (64, 32), RED)
    exif = wide.getexif()
    exif[0x0112] = 6  # rotated 90 degrees clockwise
    encoded = io.BytesIO()
    wide.save(encoded, "JPEG", exif=exif.tobytes())
    image = decode_image(data_url(encoded.getvalue(), "image/jpeg"), OPEN, number=1)
    assert image.size == (32, 64)


def test_a_16_bit_grayscale_png_keeps_its_levels_in_8_bits():
    levels = np.arange(0, 65536, 64, dtype=np.uint16).reshape(32, 32)
    image = decode_image(
        data_url(encode(Image.fromarray(levels), "PNG"), "image/png"), OPEN, number=1
    )
    assert image.mode == "L"
    np.testing.assert_array_equal(np.asarray(image), levels >> 8)


def test_base64_wrapped_over_lines_is_read():
    encoded = base64.encodebytes(encode(red_image(), "PNG")).decode("ascii")
    assert "\n" in encoded
    image = decode_image(f"data:image/png;base64,{encoded}", OPEN, number=1)
    assert tuple(rgb(image)[5, 5]) == RED


@pytest.mark.parametrize(
    ("reference", "reason"),
    [
        ("data:image/png;base64,iVBORw0K!!!!", "corrupt base64"),
        (data_url(b"plain text, no picture", "image/png"), "not an image"),
        ("data:image/png," + "abc", "must be base64"),
        ("data:image/png;base64", "no ','"),
        ("data:image/png;base64,", "empty"),
        ("ftp://example.com/red.png", "unsupported URL scheme"),
        ("", "empty"),
    ],
)  # fmt: skip
def test_unusable_data_urls_say_which_image_and_why(reference, reason):
    with pytest.raises(ImageInputError, match=reason) as caught:
        decode_image(reference, OPEN, number=3)
    assert str(caught.value).startswith("image 3: ")
    assert caught.value.number == 3


def test_a_format_outside_the_supported_four_is_named():
    with pytest.raises(ImageInputError, match="unsupported image format BMP"):
        decode_image(data_url(encode(red_image(), "BMP"), "image/bmp"), OPEN, number=1)


def test_a_truncated_png_is_corrupt():
    data = encode(Image.effect_noise((SIZE, SIZE), 50).convert("RGB"), "PNG")
    with pytest.raises(ImageInputError, match="image 1: corrupt PNG data"):
        decode_image(data_url(data[: len(data) // 2], "image/png"), OPEN, number=1)


def test_the_byte_limit_holds_for_data_urls():
    reference = red_data_url("PNG")
    small = MediaPolicy(max_bytes=100)
    with pytest.raises(ImageInputError, match="image 2: too large"):
        decode_image(reference, small, number=2)


def test_the_pixel_limit_refuses_before_decoding():
    # A 4096 x 4096 PNG of one colour is a few kilobytes: a decompression bomb in miniature.
    reference = data_url(encode(Image.new("L", (4096, 4096)), "PNG"), "image/png")
    assert len(reference) < 100_000
    with pytest.raises(ImageInputError, match="4096x4096 pixels, the limit is 1000000"):
        decode_image(reference, MediaPolicy(max_pixels=1_000_000), number=1)


@pytest.fixture
def media_dir(tmp_path: Path) -> Path:
    allowed = tmp_path / "media"
    allowed.mkdir()
    (allowed / "red.png").write_bytes(encode(red_image(), "PNG"))
    (tmp_path / "secret.png").write_bytes(encode(red_image(), "PNG"))
    return allowed


def test_local_paths_under_the_allowed_directory_are_read(media_dir):
    policy = MediaPolicy(allowed_local_path=media_dir)
    for reference in (str(media_dir / "red.png"), (media_dir / "red.png").as_uri(), "red.png"):
        assert tuple(rgb(decode_image(reference, policy, number=1))[0, 0]) == RED


def test_local_paths_are_refused_without_an_allowed_directory(media_dir):
    with pytest.raises(ImageInputError, match="image 1: local paths are not allowed"):
        decode_image(str(media_dir / "red.png"), OPEN, number=1)


@pytest.mark.parametrize(
    "escape", ["../secret.png", "{root}/../secret.png", "file://{root}/../secret.png"]
)
def test_paths_outside_the_allowed_directory_are_refused(media_dir, escape):
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(ImageInputError, match="outside the allowed directory"):
        decode_image(escape.format(root=media_dir), policy, number=1)


def test_a_symlink_escaping_the_allowed_directory_is_refused(media_dir):
    (media_dir / "link.png").symlink_to(media_dir.parent / "secret.png")
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(ImageInputError, match=r"image 1: the path .* is outside the allowed"):
        decode_image(str(media_dir / "link.png"), policy, number=1)


def test_missing_files_and_directories_are_named(media_dir):
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(ImageInputError, match="no such file"):
        decode_image("absent.png", policy, number=1)
    (media_dir / "folder").mkdir()
    with pytest.raises(ImageInputError, match="not a regular file"):
        decode_image("folder", policy, number=1)


def test_a_path_with_a_nul_character_is_refused(media_dir):
    policy = MediaPolicy(allowed_local_path=media_dir)
    for reference in ("red\0.png", "file:///red%00.png"):
        with pytest.raises(ImageInputError, match="image 1: the path holds a NUL character"):
            decode_image(reference, policy, number=1)


def test_a_file_named_on_the_command_line_needs_no_allowed_directory(media_dir):
    image = read_image_file(media_dir.parent / "secret.png", OPEN, number=1)
    assert tuple(rgb(image)[0, 0]) == RED


def test_http_is_refused_while_fetching_is_off():
    with pytest.raises(ImageInputError, match="image 1: fetching http\\(s\\) URLs is disabled"):
        decode_image("http://127.0.0.1:9/red.png", OPEN, number=1)


class _ImageHandler(http.server.BaseHTTPRequestHandler):
    png = encode(red_image(), "PNG")
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/slow.png":
            self.release.wait()
        if self.path == "/trickle.png":
            self._trickle()
            return
        if self.path == "/missing.png":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.png)))
        self.end_headers()
        self.wfile.write(self.png)

    def _trickle(self) -> None:
        """The PNG a byte at a time, each well within the read timeout of the test using it."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(self.png)))
        self.end_headers()
        for index in range(len(self.png)):
            if self.release.wait(0.05):
                return
            self.wfile.write(self.png[index : index + 1])
            self.wfile.flush()

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def image_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ImageHandler)
    _ImageHandler.release.clear()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    _ImageHandler.release.set()
    server.shutdown()
    server.server_close()


def test_fetching_reads_an_http_image_when_enabled(image_server):
    policy = MediaPolicy(fetch_enabled=True)
    image = decode_image(f"{image_server}/red.png", policy, number=1)
    assert tuple(rgb(image)[0, 0]) == RED


def test_a_fetched_body_over_the_byte_limit_is_refused(image_server):
    policy = MediaPolicy(fetch_enabled=True, max_bytes=64)
    with pytest.raises(ImageInputError, match=r"image 1: too large: .* more than 64 bytes"):
        decode_image(f"{image_server}/red.png", policy, number=1)


def test_a_failed_fetch_names_the_status(image_server):
    policy = MediaPolicy(fetch_enabled=True)
    with pytest.raises(ImageInputError, match="HTTP 404"):
        decode_image(f"{image_server}/missing.png", policy, number=1)


def test_a_fetch_that_outlasts_the_timeout_is_refused(image_server):
    policy = MediaPolicy(fetch_enabled=True, fetch_timeout_seconds=0.2)
    with pytest.raises(ImageInputError, match=r"image 2: fetching .* timed out after 0\.2 s"):
        decode_image(f"{image_server}/slow.png", policy, number=2)


def test_a_body_trickling_past_the_timeout_is_refused(image_server):
    assert len(_ImageHandler.png) > 20
    policy = MediaPolicy(fetch_enabled=True, fetch_timeout_seconds=0.5)
    with pytest.raises(ImageInputError, match=r"image 1: fetching .* timed out after 0\.5 s"):
        decode_image(f"{image_server}/trickle.png", policy, number=1)


def test_a_symlink_loop_is_refused(media_dir):
    (media_dir / "a.png").symlink_to(media_dir / "b.png")
    (media_dir / "b.png").symlink_to(media_dir / "a.png")
    policy = MediaPolicy(allowed_local_path=media_dir)
    with pytest.raises(ImageInputError, match=r"image 1: cannot resolve 'a\.png': a symlink loop"):
        decode_image("a.png", policy, number=1)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_bytes", 0), ("fetch_timeout_seconds", 0.0), ("max_pixels", 0)],
)
def test_policy_limits_must_be_positive(field, value):
    with pytest.raises(ValueError, match=field):
        MediaPolicy(**{field: value})
