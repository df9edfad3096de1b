"""The solvers behind analysis/scaling.py's fit: one fit problem on the normalised scale (x = N / N0), minimised
by a bound-projected, vectorised Levenberg-Marquardt over many weighted problems at once (the starts, the
bootstrap's resamples), the best start then carried to the optimum by the same solver. The method is described in
scaling.py's docstring."""

from __future__ import annotations

from typing import Any, Literal

N_PARAMS = 3
_E_FRACTIONS = (0.0, 0.5, 0.8, 0.95)
_ALPHA_STARTS = (0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)

Loss = Literal["huber", "least_squares"]


class Problem:
    """The data of one fit on the normalised scale, and the solvers over it (vectorised over problems)."""

    def __init__(self, x: Any, l: Any, loss: Loss, delta: float, alpha_bounds: tuple[float, float]):
        import numpy as np

        self.x, self.l, self.loss, self.delta = x, l, loss, delta
        self.logx = np.log(x)
        self.y = np.log(l) if loss == "huber" else l
        self.lower = np.array([0.0, 0.0, alpha_bounds[0]])
        self.upper = np.array([np.inf, np.inf, alpha_bounds[1]])

    def grid_starts(self) -> Any:
        import numpy as np

        rows = []
        alphas = [a for a in _ALPHA_STARTS if self.lower[2] <= a <= self.upper[2]] or [float(self.lower[2])]
        for frac in _E_FRACTIONS:
            e = frac * float(self.l.min())
            for alpha in alphas:
                basis = self.x ** -alpha
                a = max(float(np.dot(self.l - e, basis) / np.dot(basis, basis)), 1e-6)
                rows.append((e, a, alpha))
        return np.array(rows)

    def _residuals(self, theta: Any, jacobian: bool = False) -> tuple[Any, Any]:
        """Residuals (B, n) in the fit's space and, if asked, the Jacobian's three columns, each (B, n)."""
        import numpy as np

        xp = np.exp(-theta[:, 2:3] * self.logx[None, :])  # x^-alpha, cheaper than pow
        p = theta[:, :1] + theta[:, 1:2] * xp
        cols = None
        if self.loss == "huber":
            p = np.maximum(p, 1e-300)
            inv = 1.0 / p
            if jacobian:
                cols = (inv, xp * inv, -theta[:, 1:2] * xp * self.logx[None, :] * inv)
            return np.log(p) - self.y, cols
        if jacobian:
            cols = (np.ones_like(p), xp, -theta[:, 1:2] * xp * self.logx[None, :])
        return p - self.y, cols

    def _rho(self, r: Any) -> Any:
        import numpy as np

        if self.loss == "least_squares":
            return 0.5 * r * r
        a = np.abs(r)
        return np.where(a <= self.delta, 0.5 * r * r, self.delta * (a - 0.5 * self.delta))

    def objective(self, theta: Any, w: Any) -> Any:
        r, _ = self._residuals(theta)
        return (w * self._rho(r)).sum(axis=1)

    def solve(self, theta0: Any, w: Any, iters: int = 150, rtol: float = 1e-10) -> tuple[Any, Any, Any]:
        """Bound-projected Levenberg-Marquardt over B weighted problems at once (IRLS weights for Huber).

        A step is kept only when it lowers the true objective, so each problem's objective never rises.
        A problem stops when a kept step gains less than `rtol` (relative) or no damping finds a descent.
        With n ~ 10..100 points numpy's per-call overhead, not arithmetic, is the cost: the normal equations
        of all problems are one batched matmul.
        """
        import numpy as np

        theta = np.clip(theta0.astype(float), self.lower, self.upper)
        f = self.objective(theta, w)
        lam = np.full(len(theta), 1e-3)
        done = np.zeros(len(theta), dtype=bool)
        for _ in range(iters):
            idx = np.flatnonzero(~done)
            if idx.size == 0:
                break
            th, wa, fa, la = theta[idx], w[idx], f[idx], lam[idx]
            r, cols = self._residuals(th, jacobian=True)
            u = wa if self.loss == "least_squares" else wa * np.minimum(1.0, self.delta / np.maximum(np.abs(r), 1e-300))
            jac = np.stack(cols, axis=2)
            ju = jac * u[:, :, None]
            h = np.matmul(ju.transpose(0, 2, 1), jac)
            g = np.matmul(ju.transpose(0, 2, 1), r[:, :, None])[:, :, 0]
            # a parameter on a bound that the descent would push past it stays there (projected Newton): a
            # clipped step instead zig-zags along the bound in ever smaller gains
            held = ((th <= self.lower + 1e-12) & (g > 0)) | ((th >= self.upper - 1e-12) & (g < 0))
            g = np.where(held, 0.0, g)
            h = np.where(held[:, :, None] | held[:, None, :], 0.0, h) + held[:, :, None] * np.eye(N_PARAMS)
            diag = np.einsum("bii->bi", h)
            m = h + (la[:, None] * (diag + 1e-12))[:, :, None] * np.eye(N_PARAMS)
            step = np.linalg.solve(m, -g[:, :, None])[:, :, 0]
            cand = np.clip(th + step, self.lower, self.upper)
            fc = self.objective(cand, wa)
            better = fc < fa
            gain = np.where(better, (fa - fc) / np.maximum(fa, 1e-300), 0.0)
            theta[idx[better]] = cand[better]
            f[idx[better]] = fc[better]
            la = np.where(better, la * 0.3, la * 10.0)
            lam[idx] = np.clip(la, 1e-12, 1e12)
            done[idx] = (better & (gain < rtol)) | (la >= 1e12) | np.all(np.abs(step) < 1e-15, axis=1)
        return theta, f, done

    def polish(self, theta: Any) -> tuple[Any, bool]:
        """The best start carried to the optimum: the same solver, run to a relative gain of 1e-15 (numpy only:
        scipy's least_squares reaches the same optimum, and its import alone costs a report ~1 s). Returns
        (theta, converged): converged when the solver stopped because no step gains any more, not because it
        ran out of iterations."""
        import numpy as np

        out, _, done = self.solve(np.clip(theta, self.lower, self.upper)[None], np.ones((1, self.x.size)),
                                  iters=500, rtol=1e-15)
        return out[0], bool(done[0])
