"""Write `cluster/distill/data/distill_tasks.jsonl`: task-style seed prompts for `specray distill`.

The first seed file (`distill_prompts.json`, template x topic) holds open questions only. Drafts
trained on it agreed with the target on 51 % of held-out tokens but on 4-19 % of Spec-Bench's
translation, summarization, coding, extraction, math and RAG answers, task types it never saw.
This file adds them, all written here (nothing taken from Spec-Bench, MT-Bench or the tests):

- context tasks (summarise, extract, answer from, retitle, simplify a passage): the passages are
  SmolLM2-135M-Instruct's own answers from a distill data folder (`--passages`, e.g. the
  generation-2 run's OUT/data), so the draft learns to copy from its context;
- German to English translation of sentences written for this file;
- coding, math word problems (random numbers, seeded), short factual questions, role play and
  small reasoning puzzles from the templates below.

    python scripts/make_distill_tasks.py --passages runs/gen2/data --out cluster/distill/data/distill_tasks.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

CONTEXT = [
    "Summarize the following text in two or three sentences.\n\n{p}",
    "Summarize: {p}",
    "Extract the key facts from the text below as a bulleted list.\n\n{p}",
    "Read the passage and answer: what is its main idea, and which details support it?\n\nPassage: {p}",
    "Write a short title and a one-sentence summary for this article.\n\n{p}",
    "List every name, number and place mentioned in the following text as JSON.\n\n{p}",
    "Rewrite the following paragraph in simpler words for a child.\n\n{p}",
    "Based only on the document below, write two questions a reader might ask, with their answers.\n\n"
    "Document: {p}",
    "{p}\n\nUsing the text above, explain the most surprising point it makes.",
    "Here is a text:\n{p}\n\nWhat would be a good follow-up paragraph? Continue it.",
]
GERMAN = [
    "Die Stadt plant einen neuen Park am Ufer des Flusses.",
    "Nach dem starken Regen waren viele Straßen im Norden gesperrt.",
    "Die Regierung will die Steuern für kleine Unternehmen senken.",
    "Im Museum wird ab Montag eine Ausstellung über alte Karten gezeigt.",
    "Der Zug nach Berlin hatte wegen eines Defekts zwei Stunden Verspätung.",
    "Forscher haben eine neue Art von Frosch im Regenwald entdeckt.",
    "Die Preise für Gemüse sind im letzten Monat deutlich gestiegen.",
    "Unsere Schule bekommt im nächsten Jahr eine größere Bibliothek.",
    "Das Konzert wurde wegen des Sturms auf Sonntag verschoben.",
    "Viele junge Leute ziehen vom Land in die großen Städte.",
    "Der Bürgermeister hat die Brücke nach drei Jahren Bauzeit eröffnet.",
    "Die Mannschaft gewann das Spiel in der letzten Minute mit zwei zu eins.",
    "In diesem Winter war der See zum ersten Mal seit zehn Jahren zugefroren.",
    "Das Unternehmen stellt in diesem Jahr zweihundert neue Mitarbeiter ein.",
    "Ärzte empfehlen, jeden Tag mindestens dreißig Minuten zu gehen.",
    "Die Polizei sucht Zeugen für einen Unfall an der Kreuzung.",
    "Der neue Flughafen soll im Herbst endlich in Betrieb gehen.",
    "Immer mehr Menschen fahren mit dem Fahrrad zur Arbeit.",
    "Die Bibliothek bietet jetzt auch Kurse für ältere Menschen an.",
    "Wegen der Hitze wurden die Öffnungszeiten des Schwimmbads verlängert.",
    "Die Bauern hoffen nach dem trockenen Sommer auf eine bessere Ernte.",
    "Das Theater zeigt ein Stück über das Leben einer berühmten Malerin.",
    "Der Bahnhof wird in den nächsten Monaten umgebaut.",
    "Die Schüler haben einen Wettbewerb für Roboter gewonnen.",
    "Im Hafen legte gestern das größte Schiff des Jahres an.",
    "Die Zahl der Touristen ist im Frühling wieder gestiegen.",
    "Ein Feuer in einer Fabrik konnte schnell gelöscht werden.",
    "Die Universität eröffnet ein Zentrum für erneuerbare Energie.",
    "Viele Geschäfte bleiben am Feiertag geschlossen.",
    "Der Wetterdienst warnt vor Glätte auf den Straßen.",
    "Die Kinder pflanzten im Schulgarten Tomaten und Bohnen.",
    "Das neue Gesetz soll den Schutz der Wälder verbessern.",
    "Nach langen Verhandlungen einigten sich die beiden Seiten auf einen Vertrag.",
    "Die Ausstellung zeigt Fotos aus hundert Jahren Stadtgeschichte.",
    "Der Preis für Strom soll im nächsten Jahr sinken.",
    "Eine alte Mühle wurde in ein kleines Hotel verwandelt.",
    "Die Feuerwehr rettete eine Katze von einem hohen Baum.",
    "Die Firma entwickelt ein Auto, das mit Wasserstoff fährt.",
    "Im Stadtrat wurde über neue Radwege diskutiert.",
    "Das Festival lockte am Wochenende tausende Besucher an.",
]
TRANSLATE = ["Translate German to English: {s}", "Translate this sentence from German into English: {s}",
             "What does this German sentence mean in English? {s}"]
CODE_TASKS = [
    "reverses a string", "checks whether a word is a palindrome", "counts the vowels in a sentence",
    "returns the n-th Fibonacci number", "finds the largest number in a list", "removes duplicates from a list",
    "merges two sorted lists", "checks whether a number is prime", "sorts a list of words by length",
    "computes the factorial of a number", "finds the most common element in a list",
    "converts Celsius to Fahrenheit", "reads a CSV file and prints the average of one column",
    "counts how often each word appears in a text file", "flattens a nested list",
    "checks whether two strings are anagrams", "returns the second largest number in a list",
    "implements binary search", "computes the greatest common divisor of two numbers",
    "validates an email address with a regular expression", "transposes a matrix",
    "finds all pairs in a list that sum to a target", "implements a stack with push and pop",
    "reverses a linked list", "computes the running sum of a list", "capitalizes every word in a sentence",
    "returns the intersection of two lists", "finds the longest word in a sentence",
    "rotates a list by k positions", "checks whether parentheses in a string are balanced",
]
CODE = ["Write a Python function that {t}.", "Develop a Python program that {t}.",
        "Write a JavaScript function that {t}.", "Implement a C++ function that {t}.",
        "Explain step by step how to write a function that {t}, then give the code."]
MATH = [
    ("A shop sells pencils for ${a} each. Tom buys {b} pencils and pays with a ${c} bill. How much change does he get?",
     lambda r: {"a": r.randint(1, 5), "b": r.randint(2, 9), "c": 50}),
    ("A train travels {a} kilometres in {b} hours. What is its average speed?",
     lambda r: {"a": r.randint(10, 90) * 6, "b": r.randint(2, 6)}),
    ("Solve for x: {a}x + {b} = {c}.", lambda r: {"a": r.randint(2, 9), "b": r.randint(1, 30), "c": r.randint(31, 99)}),
    ("What is the area of a rectangle with sides {a} cm and {b} cm? And its perimeter?",
     lambda r: {"a": r.randint(2, 30), "b": r.randint(2, 30)}),
    ("Maria has {a} apples. She gives {b} to her brother and buys {c} more. How many apples does she have now?",
     lambda r: {"a": r.randint(10, 40), "b": r.randint(1, 9), "c": r.randint(1, 20)}),
    ("A class has {a} students and {b}% of them are girls. How many boys are in the class?",
     lambda r: {"a": r.choice([20, 25, 30, 40, 50]), "b": r.choice([20, 40, 60, 80])}),
    ("What is the sum of the first {a} positive integers?", lambda r: {"a": r.randint(10, 200)}),
    ("A recipe needs {a} eggs for {b} people. How many eggs are needed for {c} people?",
     lambda r: {"a": r.randint(2, 6), "b": r.randint(2, 4), "c": r.randint(5, 16)}),
    ("The points ({a}, {b}) and ({c}, {d}) lie on a line. What is its slope?",
     lambda r: {"a": r.randint(-5, 5), "b": r.randint(-5, 5), "c": r.randint(6, 12), "d": r.randint(-9, 9)}),
    ("Sam saves ${a} every week. How many weeks does he need to buy a bike that costs ${b}?",
     lambda r: {"a": r.randint(5, 25), "b": r.randint(10, 40) * 10}),
    ("A triangle has a base of {a} m and a height of {b} m. What is its area?",
     lambda r: {"a": r.randint(2, 20), "b": r.randint(2, 20)}),
    ("If a dozen eggs cost ${a}, how much do {b} eggs cost?", lambda r: {"a": r.randint(2, 6), "b": r.randint(3, 30)}),
]
FACTS = [
    "What is the capital of {c}?", "What language do people speak in {c}?", "What is {c} famous for?",
    "What currency is used in {c}?",
]
COUNTRIES = ["Portugal", "Kenya", "Peru", "Norway", "Vietnam", "Egypt", "Canada", "Chile", "Poland", "Thailand",
             "Morocco", "Ireland", "Japan", "Mexico", "Greece", "India", "Brazil", "Sweden", "Nigeria", "Turkey"]
PERSONAS = ["a pirate captain", "a medieval knight", "a famous chef", "a detective in London", "an astronaut on Mars",
            "a friendly robot", "a wise old wizard", "a sports coach", "a tour guide in Rome", "a marine biologist"]
ROLE_QUESTIONS = ["What did you do today?", "What advice would you give to a beginner?",
                  "Describe your favourite place.", "What is the hardest part of your job?",
                  "Tell me about your biggest adventure."]
ROLE = ["Pretend to be {who}. {q}", "You are {who}. Stay in character and answer: {q}"]
PUZZLES = [
    ("If {a} people each shake hands with every other person once, how many handshakes are there?",
     lambda r: {"a": r.randint(3, 12)}),
    ("A clock shows {a}:00. What time will it show {b} hours later?", lambda r: {"a": r.randint(1, 12), "b": r.randint(5, 30)}),
    ("Anna is {a} years older than Ben. In {b} years their ages will add up to {c}. How old is Ben now?",
     lambda r: {"a": r.randint(2, 8), "b": r.randint(2, 6), "c": r.randint(30, 60)}),
    ("There are {a} red and {b} blue balls in a bag. What is the chance of drawing a red one?",
     lambda r: {"a": r.randint(1, 9), "b": r.randint(1, 9)}),
    ("If today is {d}, what day of the week will it be in {a} days?",
     lambda r: {"d": r.choice(["Monday", "Tuesday", "Friday", "Sunday"]), "a": r.randint(3, 40)}),
]


def passages(folder: Path, limit: int, rng: random.Random) -> list[str]:
    """Target-written answers of 60+ tokens from a distill data folder, decoded."""
    from specray.cluster.distill.data import load_samples
    from specray.kernels.loader import resolve

    tok = resolve("smollm2-135m").tokenizer()
    samples = [s for s in load_samples(sorted(folder.glob("shard-*.pt"))) if len(s.response_ids) >= 60]
    rng.shuffle(samples)
    texts = [tok.decode(s.response_ids, skip_special_tokens=True).strip() for s in samples[:limit]]
    return [t for t in texts if len(t) > 200]


def build(folder: Path, num_passages: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = [rng.choice(CONTEXT).format(p=p) for p in passages(folder, num_passages, rng)]
    out += [t.format(s=s) for s in GERMAN for t in TRANSLATE]
    out += [c.format(t=t) for t in CODE_TASKS for c in rng.sample(CODE, 3)]
    out += [text.format(**args(rng)) for text, args in MATH for _ in range(8)]
    out += [f.format(c=c) for c in COUNTRIES for f in rng.sample(FACTS, 2)]
    out += [rng.choice(ROLE).format(who=w, q=q) for w in PERSONAS for q in ROLE_QUESTIONS]
    out += [text.format(**args(rng)) for text, args in PUZZLES for _ in range(6)]
    return list(dict.fromkeys(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--passages", required=True, help="a `specray distill` data folder (OUT/data)")
    ap.add_argument("--num-passages", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="cluster/distill/data/distill_tasks.jsonl")
    args = ap.parse_args()
    prompts = build(Path(args.passages), args.num_passages, args.seed)
    Path(args.out).write_text("".join(json.dumps({"prompt": p}, ensure_ascii=False) + "\n" for p in prompts))
    print(f"wrote {len(prompts)} prompts to {args.out}")


if __name__ == "__main__":
    main()
