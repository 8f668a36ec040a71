"""``shapes``: a procedurally rendered, PACS-like multi-domain dataset.

Seven shape classes are drawn in four styles that mimic PACS's domains:
``photo`` (shaded, textured object with a drop shadow on a textured, unevenly
lit background), ``painting`` (saturated colours laid down in visible brush
strokes, canvas grain), ``cartoon`` (flat cel-shaded fill with a highlight, thick dark
outline, flat two-tone backdrop) and ``sketch`` (thin, doubled pencil lines,
sometimes hatched, on white paper).

Why it exists: the default run must work offline on a fresh machine in
minutes, yet still pose a real domain-generalisation problem. The class is
carried by the outline geometry alone, which every style keeps, while colour,
texture and line statistics differ per domain, so a model that learns only
a style fails on the unseen domain.

Everything is drawn with vectorised numpy on coordinate grids: each shape is
a signed distance field (SDF), so filled, outlined and anti-aliased versions
come from one distance image, and a whole domain renders in a fraction of a
second. Output is fully determined by ``seed``; the labels and poses do not
depend on ``image_size``, so 64 px renders the same scenes more finely.

Size: ``shapes`` renders :data:`PER_CLASS` (150) images per class per domain;
the spec ``shapes:N`` renders N (``shapes:150`` is byte-identical to
``shapes``; another N draws other scenes, not a superset). ``shapes:375``
leaves 1,051 holdout records (non-members) per source client at the default
50/10/40 split — membership TPR at 1% FPR needs 1,000 to be resolved.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import FedauditError
from .base import MultiDomainDataset
from .colour import contrasting_levels, hsv, with_luma

CLASSES: list[str] = ["circle", "square", "triangle", "star", "cross", "heart", "crescent"]
DOMAINS: list[str] = ["photo", "painting", "cartoon", "sketch"]
PER_CLASS: int = 150
# ``shapes:N`` bounds: a domain renders in one vectorised pass, so memory grows with N
# (about 1.5 GB peak at N = 1000, 32 px); larger sets belong in a folder dataset.
MIN_PER_CLASS, MAX_PER_CLASS = 10, 1000

# Rotation range (radians). ±45° covers every orientation of the square and
# cross and most of the star's, while keeping hearts and crescents recognisable.
MAX_ROTATION = math.pi / 4


# --------------------------------------------------------------------------
# geometry: signed distances in the shape's local frame (radius about 1)
# --------------------------------------------------------------------------


def _polygon(angles_radii: list[tuple[float, float]]) -> np.ndarray:
    return np.array([[r * math.cos(a), r * math.sin(a)] for a, r in angles_radii], dtype=np.float32)


_UP = -math.pi / 2  # image y grows downwards, so "up" is -90°
_TRIANGLE = _polygon([(_UP + k * 2 * math.pi / 3, 1.08) for k in range(3)])
_STAR = _polygon([(_UP + k * math.pi / 5, 1.0 if k % 2 == 0 else 0.45) for k in range(10)])


def _sd_polygon(u: np.ndarray, v: np.ndarray, verts: np.ndarray) -> np.ndarray:
    """Exact signed distance to a simple polygon (negative inside), even-odd rule."""
    d2 = np.full(u.shape, np.inf, dtype=np.float32)
    inside = np.zeros(u.shape, dtype=bool)
    k = len(verts)
    for i in range(k):  # loop over edges, vectorised over all pixels of all images
        ax, ay = verts[i]
        bx, by = verts[(i + 1) % k]
        ex, ey = bx - ax, by - ay
        wx, wy = u - ax, v - ay
        t = np.clip((wx * ex + wy * ey) / (ex * ex + ey * ey), 0.0, 1.0)
        dx, dy = wx - ex * t, wy - ey * t
        np.minimum(d2, dx * dx + dy * dy, out=d2)
        if ay != by:
            crosses = ((ay > v) != (by > v)) & (u < ex * (v - ay) / (ey) + ax)
            inside ^= crosses
    d = np.sqrt(d2)
    return np.where(inside, -d, d)


def _sd_heart(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Exact heart SDF (two arcs and two lines; after Inigo Quilez), fitted to radius about 1."""
    k = 1.75  # the canonical heart spans about 1.2 x 1.1 units; this scales it to the others
    x = np.abs(u) / k
    y = -v / k + 0.55  # canonical heart has its tip at y=0 and y pointing up
    upper = np.sqrt((x - 0.25) ** 2 + (y - 0.75) ** 2) - math.sqrt(2) / 4
    m = 0.5 * np.maximum(x + y, 0)
    lower = np.sqrt(np.minimum(x * x + (y - 1) ** 2, (x - m) ** 2 + (y - m) ** 2)) * np.sign(x - y)
    return np.where(x + y > 1, upper, lower) * k


def _sd_box(u: np.ndarray, v: np.ndarray, hx: float, hy: float) -> np.ndarray:
    qx, qy = np.abs(u) - hx, np.abs(v) - hy
    outside = np.sqrt(np.maximum(qx, 0) ** 2 + np.maximum(qy, 0) ** 2)
    return outside + np.minimum(np.maximum(qx, qy), 0)


def _sd_shape(cls: int, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    name = CLASSES[cls]
    if name == "circle":
        return np.sqrt(u * u + v * v) - 0.85
    if name == "square":
        return _sd_box(u, v, 0.72, 0.72)
    if name == "triangle":
        return _sd_polygon(u, v + 0.12, _TRIANGLE)  # shift so the triangle is centred
    if name == "star":
        return _sd_polygon(u, v + 0.05, _STAR)
    if name == "cross":
        return np.minimum(_sd_box(u, v, 0.9, 0.28), _sd_box(u, v, 0.28, 0.9))
    if name == "heart":
        return _sd_heart(u, v)
    if name == "crescent":
        outer = np.sqrt(u * u + v * v) - 0.9
        bite = np.sqrt((u - 0.42) ** 2 + (v + 0.12) ** 2) - 0.72
        return np.maximum(outer, -bite)
    raise AssertionError(name)


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _uniform(rng: np.random.Generator, lo: float, hi: float, size: int | tuple[int, ...]) -> np.ndarray:
    """float32 uniform draws: float64 scalars would silently upcast every image array."""
    return rng.uniform(lo, hi, size).astype(np.float32)


def _smooth_noise(rng: np.random.Generator, n: int, grid: int, size: int) -> np.ndarray:
    """Band-limited noise (about unit std): a random grid x grid field, bicubic-upsampled."""
    g = torch.from_numpy(rng.standard_normal((n, 1, grid, grid)).astype(np.float32))
    up = F.interpolate(g, size=(size, size), mode="bicubic", align_corners=True)
    return up[:, 0].numpy()


def _coverage(d_px: np.ndarray) -> np.ndarray:
    """Anti-aliased inside-coverage from a signed distance in pixels."""
    return np.clip(0.5 - d_px, 0.0, 1.0)


def _line(d_px: np.ndarray, width: float | np.ndarray) -> np.ndarray:
    """Anti-aliased stroke of the given width (pixels) centred on the outline."""
    return np.clip(0.5 - (np.abs(d_px) - np.asarray(width) / 2), 0.0, 1.0)


class _Layout:
    """Per-image pose (centre, scale, rotation) and the pixel grid."""

    def __init__(self, rng: np.random.Generator, labels: np.ndarray, size: int):
        n = len(labels)
        self.labels, self.size, self.n = labels, size, n
        self.scale = _uniform(rng, 0.5, 0.78, n)  # shape radius, in half-image units
        room = 0.95 - self.scale  # keep the whole shape inside the frame
        self.cx = _uniform(rng, -1, 1, n) * room
        self.cy = _uniform(rng, -1, 1, n) * room
        self.theta = _uniform(rng, -MAX_ROTATION, MAX_ROTATION, n)
        c = (np.arange(size, dtype=np.float32) + 0.5) / size * 2 - 1  # pixel centres in [-1, 1]
        self.x = np.broadcast_to(c[None, None, :], (n, size, size))
        self.y = np.broadcast_to(c[None, :, None], (n, size, size))

    def along(self, cx: np.ndarray, cy: np.ndarray) -> np.ndarray:
        """Signed position along the unit direction (cx, cy) from each shape's centre, in shape radii."""
        e = lambda a: a[:, None, None]  # noqa: E731
        return ((self.x - e(self.cx)) * cx + (self.y - e(self.cy)) * cy) / e(self.scale)

    def local_radius(self, ox: np.ndarray, oy: np.ndarray) -> np.ndarray:
        """Distance, in shape radii, from the point at offset (ox, oy) radii from each shape's centre."""
        e = lambda a: a[:, None, None]  # noqa: E731
        dx = (self.x - e(self.cx)) / e(self.scale) - ox
        dy = (self.y - e(self.cy)) / e(self.scale) - oy
        return np.sqrt(dx * dx + dy * dy)

    def distance_px(self, dx: np.ndarray | float = 0.0, dy: np.ndarray | float = 0.0) -> np.ndarray:
        """Signed distance to each image's shape, in pixels, with the grid displaced by (dx, dy)."""
        e = lambda a: a[:, None, None]  # noqa: E731 - per-image scalars over the grid
        px, py = self.x + dx - e(self.cx), self.y + dy - e(self.cy)
        cos, sin = e(np.cos(self.theta)), e(np.sin(self.theta))
        u = (px * cos + py * sin) / e(self.scale)
        v = (-px * sin + py * cos) / e(self.scale)
        out = np.empty((self.n, self.size, self.size), dtype=np.float32)
        for k in range(len(CLASSES)):
            sel = self.labels == k
            if sel.any():
                out[sel] = _sd_shape(k, u[sel], v[sel])
        # local units -> pixels: one local unit is `scale` half-images
        return out * e(self.scale) * (self.size / 2)


def _blend(bg: np.ndarray, fg: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    a = alpha[..., None]
    return bg * (1 - a) + fg * a


# --------------------------------------------------------------------------
# the four styles; each returns float images [N, H, W, 3] in [0, 1]
# --------------------------------------------------------------------------


def _photo(rng: np.random.Generator, lay: _Layout) -> np.ndarray:
    n, s = lay.n, lay.size
    # muted colours with a guaranteed brightness (luma) gap: with a gap in HSV value
    # only, pairs like blue on black were too faint to learn from 75 images a class
    l_obj, l_bg = contrasting_levels(rng, n, dark=(0.1, 0.4), light=(0.55, 0.9))
    obj = with_luma(hsv(rng.random(n), _uniform(rng, 0.2, 0.7, n), 1.0), l_obj)[:, None, None]
    bg = with_luma(hsv(rng.random(n), _uniform(rng, 0.1, 0.5, n), 1.0), l_bg)[:, None, None]
    # background: smooth blotches + fine grain, as on a real surface
    tex = 0.08 * _smooth_noise(rng, n, 5, s) + 0.03 * _smooth_noise(rng, n, max(4, s // 2), s)
    bg = bg * (1 + tex[..., None])
    # one light source: a smooth brightness gradient across the whole scene
    a = _uniform(rng, 0, 2 * math.pi, n)[:, None, None]
    light = 1 + 0.25 * (lay.x * np.cos(a) + lay.y * np.sin(a))
    d = lay.distance_px()
    # soft drop shadow away from the light
    off = 0.08 * np.stack([np.cos(a[:, 0, 0]), np.sin(a[:, 0, 0])])
    d_sh = lay.distance_px(off[0][:, None, None], off[1][:, None, None])
    bg = bg * (1 - 0.4 * np.clip(0.5 - d_sh / 2.5, 0, 1))[..., None]
    # object: shaded towards its rim (a rounded look) plus a fine surface texture
    rim = np.clip(-d / (lay.scale[:, None, None] * s * 0.25), 0, 1)
    shade = 0.75 + 0.25 * rim + 0.05 * _smooth_noise(rng, n, max(4, s // 3), s)
    img = _blend(bg, obj * shade[..., None], _coverage(d))
    return img * light[..., None]


def _brush_field(rng: np.random.Generator, lay: _Layout) -> np.ndarray:
    """Per-pixel colour offsets [N, H, W, 3] that are constant along short parallel brush strokes."""
    n, s = lay.n, lay.size
    px = s / 32  # stroke sizes are in pixels at 32 px and scale with the image
    phi = _uniform(rng, 0, math.pi, n)[:, None, None]
    width = _uniform(rng, 2.5, 3.5, (n, 1, 1)) * px
    length = _uniform(rng, 7, 11, (n, 1, 1)) * px
    xs, ys = lay.x * s / 2, lay.y * s / 2  # grid in pixels
    along = xs * np.cos(phi) + ys * np.sin(phi)
    across = -xs * np.sin(phi) + ys * np.cos(phi) + 0.8 * px * _smooth_noise(rng, n, 4, s)  # not ruler-straight
    rows, cols = 64, 16
    iq = np.floor(across / width).astype(np.int64) % rows
    shift = rng.random((n, rows))  # stagger where strokes start, row by row
    ii = np.arange(n)[:, None, None]
    it = np.floor(along / length + shift[ii, iq]).astype(np.int64) % cols
    table = rng.standard_normal((n, rows, cols, 3)).astype(np.float32)
    common = rng.standard_normal((n, rows, cols, 1)).astype(np.float32)  # brightness varies more than hue
    return 0.02 * table[ii, iq, it] + 0.03 * common[ii, iq, it]


def _painting(rng: np.random.Generator, lay: _Layout) -> np.ndarray:
    n = lay.n
    h_obj = rng.random(n)
    h_bg = h_obj + _uniform(rng, 0.25, 0.75, n)  # clearly different, saturated hues
    v_obj, v_bg = contrasting_levels(rng, n, dark=(0.12, 0.45), light=(0.65, 0.98))
    obj = hsv(h_obj, _uniform(rng, 0.7, 1.0, n), 0.15 + 0.85 * v_obj)[:, None, None]
    bg = hsv(h_bg, _uniform(rng, 0.6, 1.0, n), 0.15 + 0.85 * v_bg)[:, None, None]
    # strokes over object and ground alike; the outline itself stays crisp so the
    # shape is legible at 32 px (stronger strokes or wobbly edges made painting
    # the one domain a small CNN could not learn from 75 images per class)
    img = _blend(bg, obj, _coverage(lay.distance_px())) + _brush_field(rng, lay)
    return img + 0.02 * rng.standard_normal(img.shape).astype(np.float32)  # canvas grain


def _cartoon(rng: np.random.Generator, lay: _Layout) -> np.ndarray:
    n, s = lay.n, lay.size
    h_obj = rng.random(n)
    obj = hsv(h_obj, _uniform(rng, 0.6, 1.0, n), _uniform(rng, 0.7, 1.0, n))[:, None, None]
    h_bg = h_obj + _uniform(rng, 0.2, 0.8, n)
    bg = hsv(h_bg, _uniform(rng, 0.05, 0.4, n), _uniform(rng, 0.85, 1.0, n))[:, None, None]
    ground = hsv(h_bg + _uniform(rng, -0.1, 0.1, n), _uniform(rng, 0.2, 0.6, n), _uniform(rng, 0.6, 0.9, n))
    # flat two-tone backdrop (sky / ground) split by a straight line, as cartoons often are
    psi = _uniform(rng, math.pi / 2 - 0.4, math.pi / 2 + 0.4, (n, 1, 1))
    horizon = lay.x * np.cos(psi) + lay.y * np.sin(psi) - _uniform(rng, 0.0, 0.9, (n, 1, 1))
    bg = _blend(bg, ground[:, None, None], np.clip(0.5 + horizon * s / 2, 0, 1))
    # cel shading: a hard-edged darker tone on one side, and a small white highlight
    omega = _uniform(rng, 0, 2 * math.pi, (n, 1, 1))
    shade_side = lay.along(np.cos(omega), np.sin(omega)) > _uniform(rng, -0.1, 0.4, (n, 1, 1))
    fill = obj * np.where(shade_side, 0.7, 1.0)[..., None]
    hl = lay.local_radius(-0.35 * np.cos(omega), -0.35 * np.sin(omega)) < 0.14
    d = lay.distance_px()
    inside = _coverage(d)
    fill = _blend(fill, np.ones_like(fill), hl * inside * 0.9)
    img = _blend(bg, fill, inside)
    ink = _uniform(rng, 0.0, 0.15, (n, 1, 1, 1))
    width = (s / 32) * _uniform(rng, 2.0, 2.8, (n, 1, 1))  # thick outline, scales with resolution
    return _blend(img, np.broadcast_to(ink, img.shape), _line(d, width))


def _sketch(rng: np.random.Generator, lay: _Layout) -> np.ndarray:
    n, s = lay.n, lay.size
    paper = _uniform(rng, 0.9, 1.0, (n, 1, 1)) + 0.02 * _smooth_noise(rng, n, max(4, s // 2), s)
    lead = _uniform(rng, 0.05, 0.3, (n, 1, 1))
    width = (s / 32) * _uniform(rng, 0.9, 1.3, (n, 1, 1))
    # two slightly different pencil passes: the sketchy double line
    amp = 0.6 * 2 / s
    ink = np.zeros((n, s, s), dtype=np.float32)
    for _ in range(2):
        d = lay.distance_px(amp * _smooth_noise(rng, n, 5, s), amp * _smooth_noise(rng, n, 5, s))
        ink = np.maximum(ink, _line(d, width) * _uniform(rng, 0.6, 1.0, (n, 1, 1)))
    # light hatching on the shadow side of about half the drawings, as artists shade
    eta = _uniform(rng, 0, math.pi, (n, 1, 1))
    spacing = (s / 32) * _uniform(rng, 2.5, 3.5, (n, 1, 1))
    t = (lay.x * np.cos(eta) + lay.y * np.sin(eta)) * s / 2
    hatch = np.clip(1 - np.abs((t % spacing) - spacing / 2) / (0.5 * width), 0, 1)
    omega = _uniform(rng, 0, 2 * math.pi, (n, 1, 1))
    side = lay.along(np.cos(omega), np.sin(omega)) > _uniform(rng, -0.1, 0.4, (n, 1, 1))
    shaded = (rng.random((n, 1, 1)) < 0.5) & side
    ink = np.maximum(ink, 0.45 * hatch * _coverage(d + 0.5) * shaded)
    grey = paper * (1 - ink) + lead * ink
    return np.repeat(grey[..., None], 3, axis=-1)


_STYLES = {"photo": _photo, "painting": _painting, "cartoon": _cartoon, "sketch": _sketch}


def render_domain(
    domain: str, image_size: int, seed: int, per_class: int = PER_CLASS
) -> tuple[torch.Tensor, torch.Tensor]:
    """Render one domain: uint8 images [N, 3, S, S] and int64 labels [N], shuffled."""
    # an independent random stream per (seed, domain): changing one domain never changes another
    rng = np.random.default_rng([seed % (1 << 64), DOMAINS.index(domain)])
    labels = rng.permutation(np.repeat(np.arange(len(CLASSES)), per_class))
    lay = _Layout(rng, labels, image_size)
    img = _STYLES[domain](rng, lay)
    u8 = np.clip(np.rint(img * 255), 0, 255).astype(np.uint8)
    return torch.from_numpy(u8).permute(0, 3, 1, 2).contiguous(), torch.from_numpy(labels.astype(np.int64))


def per_class_of(spec: str) -> int:
    """Images per class per domain named by ``shapes`` or ``shapes:N``; FedauditError naming the fix otherwise."""
    if spec == "shapes":
        return PER_CLASS
    text = spec[len("shapes:"):]
    if text.isascii() and text.isdigit() and MIN_PER_CLASS <= int(text) <= MAX_PER_CLASS:
        return int(text)
    raise FedauditError(
        f"dataset spec {spec!r} is not valid; give shapes:N with N images per class per domain, a whole number "
        f"from {MIN_PER_CLASS} to {MAX_PER_CLASS} (e.g. shapes:375 for 1,000+ non-members per client), or plain shapes"
    )


def load_shapes(image_size: int = 32, seed: int = 0, per_class: int = PER_CLASS, name: str = "shapes") -> MultiDomainDataset:
    """Build the ``shapes`` dataset: 7 classes x 4 styles, ``per_class`` images per class per domain."""
    images, labels = {}, {}
    for dom in DOMAINS:
        images[dom], labels[dom] = render_domain(dom, image_size, seed, per_class)
    return MultiDomainDataset(
        name=name, classes=list(CLASSES), domains=list(DOMAINS), images=images, labels=labels, hflip=True
    )
