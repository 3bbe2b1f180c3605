from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProposalKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PROPOSAL_KIND_CHAIN: _ClassVar[ProposalKind]
    PROPOSAL_KIND_WOR_TREE: _ClassVar[ProposalKind]
    PROPOSAL_KIND_IID: _ClassVar[ProposalKind]
    PROPOSAL_KIND_DETERMINISTIC_TREE: _ClassVar[ProposalKind]
PROPOSAL_KIND_CHAIN: ProposalKind
PROPOSAL_KIND_WOR_TREE: ProposalKind
PROPOSAL_KIND_IID: ProposalKind
PROPOSAL_KIND_DETERMINISTIC_TREE: ProposalKind

class DraftSeqSpec(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ...) -> None: ...

class DraftItem(_message.Message):
    __slots__ = ("seq_id", "committed_delta", "num_draft_tokens", "spec", "verify_budget", "features", "feature_rows")
    SEQ_ID_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_DELTA_FIELD_NUMBER: _ClassVar[int]
    NUM_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    VERIFY_BUDGET_FIELD_NUMBER: _ClassVar[int]
    FEATURES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_ROWS_FIELD_NUMBER: _ClassVar[int]
    seq_id: str
    committed_delta: _containers.RepeatedScalarFieldContainer[int]
    num_draft_tokens: int
    spec: DraftSeqSpec
    verify_budget: int
    features: bytes
    feature_rows: int
    def __init__(self, seq_id: _Optional[str] = ..., committed_delta: _Optional[_Iterable[int]] = ..., num_draft_tokens: _Optional[int] = ..., spec: _Optional[_Union[DraftSeqSpec, _Mapping]] = ..., verify_budget: _Optional[int] = ..., features: _Optional[bytes] = ..., feature_rows: _Optional[int] = ...) -> None: ...

class ProposeRequest(_message.Message):
    __slots__ = ("items", "method")
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DraftItem]
    method: str
    def __init__(self, items: _Optional[_Iterable[_Union[DraftItem, _Mapping]]] = ..., method: _Optional[str] = ...) -> None: ...

class DraftProbs(_message.Message):
    __slots__ = ("vocab_size", "dense", "row_offsets", "indices", "values")
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    DENSE_FIELD_NUMBER: _ClassVar[int]
    ROW_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    INDICES_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    vocab_size: int
    dense: bytes
    row_offsets: _containers.RepeatedScalarFieldContainer[int]
    indices: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, vocab_size: _Optional[int] = ..., dense: _Optional[bytes] = ..., row_offsets: _Optional[_Iterable[int]] = ..., indices: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class DraftProposal(_message.Message):
    __slots__ = ("draft_token_ids", "probs", "kind", "parents", "counts")
    DRAFT_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PARENTS_FIELD_NUMBER: _ClassVar[int]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    draft_token_ids: _containers.RepeatedScalarFieldContainer[int]
    probs: DraftProbs
    kind: ProposalKind
    parents: _containers.RepeatedScalarFieldContainer[int]
    counts: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, draft_token_ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Union[DraftProbs, _Mapping]] = ..., kind: _Optional[_Union[ProposalKind, str]] = ..., parents: _Optional[_Iterable[int]] = ..., counts: _Optional[_Iterable[int]] = ...) -> None: ...

class ProposeResponse(_message.Message):
    __slots__ = ("proposals",)
    PROPOSALS_FIELD_NUMBER: _ClassVar[int]
    proposals: _containers.RepeatedCompositeFieldContainer[DraftProposal]
    def __init__(self, proposals: _Optional[_Iterable[_Union[DraftProposal, _Mapping]]] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("seq_ids",)
    SEQ_IDS_FIELD_NUMBER: _ClassVar[int]
    seq_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, seq_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ("method", "vocab_size")
    METHOD_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    method: str
    vocab_size: int
    def __init__(self, method: _Optional[str] = ..., vocab_size: _Optional[int] = ...) -> None: ...
