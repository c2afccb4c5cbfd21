"""The append-only, hash-chained ledger of decisions and quota changes."""

from service.ledger.chain import (
    GENESIS_HASH,
    ChainBreak,
    LedgerEntry,
    NewLedgerEntry,
    Verification,
    verify_chain,
)

__all__ = [
    "GENESIS_HASH",
    "ChainBreak",
    "LedgerEntry",
    "NewLedgerEntry",
    "Verification",
    "verify_chain",
]
