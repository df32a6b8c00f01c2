from __future__ import annotations

from fastapi import APIRouter

from service.access_schema import objects
from service.budgets import service
from service.budgets.schemas import BudgetList, Ledger
from service.deps import OwnerOrAdminDep, SessionDep
from service.errors_http import responses

router = APIRouter(prefix="/budgets", tags=["budgets"])


@router.get("", responses=responses(401, 403), summary="Budget, spend and release count")
def list_budgets(session: SessionDep, principal: OwnerOrAdminDep) -> BudgetList:
    return service.list_budgets(session, principal=principal)


@router.get(
    "/{dataset_id}",
    responses=responses(401, 403, 404),
    summary="A dataset's ledger entries",
    openapi_extra=objects("the dataset's owner, admins"),
)
def get_ledger(dataset_id: str, session: SessionDep, principal: OwnerOrAdminDep) -> Ledger:
    return service.ledger(session, principal=principal, dataset_id=dataset_id)
