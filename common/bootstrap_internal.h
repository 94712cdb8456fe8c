/*
 * bootstrap_internal.h — what the bootstrap protocol's halves share (common/bootstrap.c):
 * the layout's protobuf form and the cluster-key check. For prefill/bootstrap_server.c and
 * decode/bootstrap_client.c only.
 */
#ifndef PD_BOOTSTRAP_INTERNAL_H
#define PD_BOOTSTRAP_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/bootstrap.h"
#include "pdserve/v1/bootstrap.pb-c.h"

void pd__bootstrap_layout_to_pb(const struct pd_bootstrap_layout *l, Pdserve__V1__Layout *pb);
void pd__bootstrap_layout_from_pb(const Pdserve__V1__Layout *pb, struct pd_bootstrap_layout *l);
/* Constant time in the key's content: a refusal says nothing about how much was right. */
bool pd__bootstrap_key_ok(const uint8_t *want, size_t want_len, ProtobufCBinaryData got);

#endif
