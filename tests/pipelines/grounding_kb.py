"""A small help centre of a business no shipped file describes (a piano-tuning service), for
the answer-selection and grounded-chat tests."""
from __future__ import annotations

from pathlib import Path

ARTICLES = {
    "tuning-visits.md": """# Tuning Visits

## Booking a visit

You can book a tuning visit online up to 8 weeks ahead. A standard tuning visit lasts about 90 minutes.

Visit prices:

- **Upright piano**: 120 EUR per visit.
- **Grand piano**: 165 EUR per visit.
- **Pitch raise** (a piano not tuned for over 3 years): an extra 45 EUR.

## Rescheduling

Reschedule or cancel for free up to 48 hours before the visit. Later cancellations cost 30 EUR.
""",
    "moving-pianos.md": """# Moving a Piano

## Before a move

Our movers need the stairs and doorways measured before the day. Moving a piano within the city costs 260 EUR,
and each flight of stairs adds 40 EUR.

## After a move

Let a piano settle for 3 weeks after a move before you book a tuning.
""",
    "contact.md": """# Contact Us

## Phone and email

Our phone line is open from 9:00 to 17:00 on weekdays. Email replies take up to 2 working days.

## Where we work

We visit homes anywhere within 40 km of the Oakridge studio, and in the North Valley district:
- Weekday visits in the North Valley district cost an extra 20 EUR.
""",
    "lessons.md": """# Lessons

## Trial lesson

Your first lesson is a free 30-minute trial. After that, lessons are sold in blocks of 10.

Unused lessons move to your next block. We can't refund lessons once a block has started.

## Teachers

All our teachers hold a conservatory diploma. Lessons take place at our Oakridge studio.
""",
}


def write_kb(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in ARTICLES.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder
