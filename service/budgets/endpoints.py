from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from service.auth.schemas import Role
from service.budgets import service
from service.budgets.schemas import BudgetList, Ledger
from service.deps import SessionDep, require_roles
from service.errors_http import responses
from service.models import Principal

router = APIRouter(prefix="/budgets", tags=["budgets"])

OwnerOrAdminDep = Annotated[Principal, Depends(require_roles(Role.owner, Role.admin))]


@router.get("", responses=responses(401, 403), summary="Budget, spend and release count")
def list_budgets(session: SessionDep, principal: OwnerOrAdminDep) -> BudgetList:
    return service.list_budgets(session, principal=principal)


@router.get(
    "/{dataset_id}", responses=responses(401, 403, 404), summary="A dataset's ledger entries"
)
def get_ledger(dataset_id: str, session: SessionDep, principal: OwnerOrAdminDep) -> Ledger:
    return service.ledger(session, principal=principal, dataset_id=dataset_id)
