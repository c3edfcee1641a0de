"""Human-written dates in eight languages -> ISO 8601, as a TFDS dataset.

Each example is a date as people write it, e.g. "29 novembre 2026",
"Sunday, November 29, 2026", "29.11.26", "domingo, 29 de noviembre de 2026",
and its ISO form "2026-11-29". The texts are generated in code with the CLDR
date formats of `babel` (no data file, no network): full, long, medium and
short formats and a few common hand-written patterns, in the locales
`LOCALES`; some are lowercased or uppercased as people type them.

- Dates run from 1950-01-01 to 2049-12-31, so a two-digit year is read with
  the pivot 50 ("26" -> 2026, "61" -> 1961).
- Numeric formats are only produced for day-first locales (and year-first
  "2026/11/29"), so every text has exactly one reading: exact match can reach
  100%.
- Splits are by date (a hash of the ISO date): no test date appears in the
  training split in any language or format.

The dataset is generated deterministically (fixed seeds), so every run and
every machine gets the same examples.
"""

import datetime

import numpy as np
import tensorflow_datasets as tfds

from examples.common import datasets

LOCALES = (
    "en_US",
    "en_GB",
    "fr_FR",
    "de_DE",
    "es_ES",
    "it_IT",
    "pt_PT",
    "nl_NL",
)
NAMED_FORMATS = ("full", "long", "medium", "short")
# Hand-written CLDR patterns besides the locale's own formats.
WORD_PATTERNS = ("d MMMM y", "EEEE d MMMM y", "d MMM y", "MMMM d, y")
DAY_FIRST_NUMERIC = (
    "dd.MM.yy",
    "d.M.yyyy",
    "dd/MM/yyyy",
    "d/M/yy",
    "dd-MM-yyyy",
)
YEAR_FIRST_NUMERIC = ("yyyy/MM/dd", "y.MM.dd")
MONTH_FIRST_LOCALES = ("en_US",)

FIRST_DAY = datetime.date(1950, 1, 1)
LAST_DAY = datetime.date(2049, 12, 31)
SIZES = {
    "default": {"train": 30000, "validation": 1000, "test": 2000},
    "tiny": {"train": 2000, "validation": 200, "test": 200},
}
_SEEDS = {"train": 1, "validation": 2, "test": 3}


def split_of(iso):
    """Split of a date: 5% test, 5% validation, by a hash of the date."""
    return datasets.split_of_key(iso, 20)


def formats_for(locale):
    """The patterns used for a locale (named formats or CLDR patterns)."""
    numeric = () if locale in MONTH_FIRST_LOCALES else DAY_FIRST_NUMERIC
    named = tuple(
        f
        for f in NAMED_FORMATS
        if not (f == "short" and locale in MONTH_FIRST_LOCALES)
    )
    return named + WORD_PATTERNS + numeric + YEAR_FIRST_NUMERIC


def write_date(date, locale, pattern, case):
    """One human-written form of `date`."""
    from babel.dates import format_date

    text = format_date(date, format=pattern, locale=locale)
    return {"lower": text.lower(), "upper": text.upper()}.get(case, text)


def generate(split, count, seed=None):
    """Yields `count` `(text, iso, locale)` triples of dates of `split`."""
    rng = np.random.default_rng(_SEEDS[split] if seed is None else seed)
    days = (LAST_DAY - FIRST_DAY).days + 1
    produced = 0
    while produced < count:
        date = FIRST_DAY + datetime.timedelta(days=int(rng.integers(days)))
        iso = date.isoformat()
        if split_of(iso) != split:
            continue
        locale = LOCALES[rng.integers(len(LOCALES))]
        patterns = formats_for(locale)
        pattern = patterns[rng.integers(len(patterns))]
        case = rng.choice(["as is"] * 8 + ["lower", "upper"])
        yield write_date(date, locale, pattern, case), iso, locale
        produced += 1


class MultilingualDates(datasets.ShippedBuilder):
    """Human-written multilingual dates and their ISO 8601 form."""

    BUILDER_CONFIGS = [
        tfds.core.BuilderConfig(
            name=name,
            description=f"{sizes['train']} train, {sizes['validation']} "
            f"validation and {sizes['test']} test examples.",
        )
        for name, sizes in SIZES.items()
    ]

    def _info(self):
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "text": tfds.features.Text(),
                    "iso": tfds.features.Text(),
                    "locale": tfds.features.Text(),
                }
            ),
            supervised_keys=("text", "iso"),
            homepage="https://babel.pocoo.org/",
        )

    def _generate_examples(self, split):
        count = SIZES[self.builder_config.name][split]
        for i, (text, iso, locale) in enumerate(generate(split, count)):
            yield i, {"text": text, "iso": iso, "locale": locale}
