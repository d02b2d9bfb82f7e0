"""Query results as DataFrames, cheaply: .df() costs 1-2 ms per small result on top of the
query; a Live refresh makes a dozen."""

from __future__ import annotations

import numpy as np
import pandas as pd


def frame_of(result) -> pd.DataFrame:
    """A query's result as a DataFrame through numpy, cheaper than .df(); NULL is NaN in a
    numeric column, None in any other."""
    return pd.DataFrame({name: _unmasked(values) for name, values in
                         result.fetchnumpy().items()})


def _unmasked(values):
    if not np.ma.isMaskedArray(values):
        return values
    if not values.mask.any():
        return values.data
    if values.dtype.kind in "iuf":
        return np.ma.filled(values.astype(float), np.nan)
    return np.where(values.mask, None, values.data.astype(object))
