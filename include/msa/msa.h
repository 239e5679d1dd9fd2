// Umbrella header: the whole public C++ API of msa.
#pragma once

#include "msa/attention.h"
#include "msa/common.h"
#include "msa/csr.h"
#include "msa/decode.h"
#include "msa/dlpack.h"
#include "msa/error.h"
#include "msa/icp.h"
#include "msa/indexer.h"
#include "msa/logits.h"
#include "msa/pipeline.h"
#include "msa/quant.h"
#include "msa/sdsa.h"
#include "msa/tensor.h"
#include "msa/token_sparse.h"
#include "msa/topk.h"
#include "msa/version.h"
