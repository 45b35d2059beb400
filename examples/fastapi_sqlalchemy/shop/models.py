"""The shop's tables, declared with SQLAlchemy's ORM."""

from __future__ import annotations

from sqlalchemy import String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """The shop's declarative base."""


class Order(Base):
    """An order: who placed it, what it costs, whether its receipt went out."""

    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    email: Mapped[str] = mapped_column(String(254))
    total_cents: Mapped[int]
    receipt_sent: Mapped[bool] = mapped_column(default=False)
