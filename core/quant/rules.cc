#include "core/quant/rules.h"

#include <array>

namespace ckpt::quant {
namespace {

using K = RuleKind;

// To add a rule: one line here (in its kind's block), a fixture that triggers it and a test
// that asserts it (docs/rules.md, "Adding a rule"). Fields: id, kind, reason, upstream,
// fixture, test. Fixture names are tests/data folders; "mini-kimi-*" are the Kimi-K3 minis.
constexpr Rule kRules[] = {
    // Format detection and the config/tensor contract (docs/quant.md "Format detection").
    {"bad-pattern", K::kContract, "an ignore/targets entry starting 're:' is not a valid regex",
     "own: a pattern that cannot match hides what it was meant to exclude",
     "mini-kimi-mxfp4 with ignore entry 're:(unclosed'",
     "tests/quant/rule_triggers_test.cc Mxfp4Config.IgnoreEntryThatIsNotARegexIsBadPattern"},
    {"config-disagreement", K::kContract,
     "top-level and text_config quantization_config differ, or kimi_x4t lacks the nested copy",
     "own: loaders read one or the other (docs/formats.md §2)",
     "mini-kimi-x4t without the nested quantization_config",
     "tests/quant/format_test.cc Format.X4TManifestAndNestedConfigAreChecked"},
    {"config-group", K::kContract,
     "a config group without a weights scheme, not 4-bit float, or with the wrong strategy",
     "own: the config must declare the layout the tensors have (docs/formats.md §4)",
     "mini-kimi-mxfp4 with weights num_bits 8",
     "tests/quant/rule_triggers_test.cc "
     "Mxfp4Config.WeightsThatAreNot4BitFloatAreAConfigGroupFinding"},
    {"group-size", K::kContract,
     "config group_size, or a scale shape, that is not one scale per 32 (MXFP4) / 16 (NVFP4)",
     "own: a loader reshapes scales by the declared group size (docs/formats.md §4)",
     "mini-kimi-mxfp4 with group_size 16 in config.json",
     "tests/quant/format_test.cc Format.ConfigGroupSizeMismatch"},
    {"missing-scale", K::kContract, "a packed FP4 tensor without its block/group scale tensor",
     "own: FP4 codes without scales have no value (docs/formats.md §4)",
     "mini-kimi-mxfp4 with one weight_scale renamed",
     "tests/quant/format_test.cc Format.MissingScaleAndExtraTensor"},
    {"scale-dtype", K::kContract,
     "a scale tensor of the wrong dtype (E8M0/U8 for MXFP4, F8_E4M3 for NVFP4)",
     "own: the dtype decides the scale's decoding (docs/formats.md §3)",
     "mini-kimi-mxfp4 with one weight_scale declared I8",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.WrongScaleOrPackedDtypeIsNamed"},
    {"packed-shape", K::kContract,
     "packed weights that are not U8 [out, in/2] (gpt-oss: [E, rows, in/32, 16])",
     "own: two E2M1 codes per byte (docs/formats.md §3, §4)",
     "mini-kimi-mxfp4 with one weight_packed declared I8",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.WrongScaleOrPackedDtypeIsNamed"},
    {"missing-global-scale", K::kContract, "an NVFP4 module without weight_global_scale",
     "own: NVFP4 values need the per-tensor scale (docs/formats.md §4)",
     "mini-kimi-nvfp4 with one weight_global_scale renamed",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.Nvfp4GlobalScaleMissingOrNotF32IsNamed"},
    {"global-scale-shape", K::kContract, "weight_global_scale that is not F32 [1]",
     "own: compressed-tensors writes F32 [1] (docs/formats.md §4)",
     "mini-kimi-nvfp4 with one weight_global_scale declared I32",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.Nvfp4GlobalScaleMissingOrNotF32IsNamed"},
    {"missing-input-global-scale", K::kContract,
     "a W4A4 NVFP4 module without input_global_scale",
     "own: W4A4 kernels quantize activations with it (docs/formats.md §4)",
     "mini-kimi-nvfp4 with input_activations declared in config.json",
     "tests/quant/format_test.cc Format.W4A4NeedsInputGlobalScales"},
    {"extra-tensor", K::kContract,
     "a tensor its format does not have (e.g. input_global_scale in A16); in a pair: a derived "
     "tensor without a source",
     "own: a stray tensor is loaded by some runtimes and ignored by others",
     "mini-kimi-mxfp4 with one weight_scale renamed",
     "tests/quant/format_test.cc Format.MissingScaleAndExtraTensor"},
    {"missing-tensor", K::kContract,
     "a routed expert matrix the config implies is absent; in a pair: a source tensor without "
     "a derived one",
     "own: a loader fills absent experts with uninitialised memory (docs/formats.md §2)",
     "mini-kimi-mxfp4 with n_routed_experts raised to 17",
     "tests/quant/format_test.cc Format.GeometryComesFromConfig"},
    {"geometry", K::kContract,
     "a routed expert's shape or index disagrees with the config (expert count, sizes)",
     "own: a loader shapes its parameters from config.json (docs/formats.md §2, §4)",
     "mini-kimi-mxfp4 with moe_intermediate_size changed",
     "tests/quant/format_test.cc Format.GeometryComesFromConfig"},
    {"ignore-covers-quantized", K::kContract,
     "a quantized tensor matched by ignore / modules_to_not_convert",
     "own: a loader would read packed bytes as a dense weight (docs/formats.md §4)",
     "mini-kimi-mxfp4 with an ignore entry matching an expert",
     "tests/quant/format_test.cc Format.IgnoreListCoveringAQuantizedTensor"},
    {"untargeted-quantized", K::kContract, "a quantized tensor that no config group targets",
     "own: a loader would not build a quantized layer for it (docs/formats.md §4)",
     "mini-kimi-mxfp4 with targets matching nothing",
     "tests/quant/rule_triggers_test.cc "
     "Mxfp4Config.TargetsMatchingNoQuantizedTensorLeaveEveryOneUntargeted"},
    {"unquantized-target", K::kContract,
     "a module targeted by a config group but stored unquantized",
     "own: a loader would expect packed tensors that are not there (docs/formats.md §4)",
     "mini-kimi-mxfp4 with embed_tokens added to targets",
     "tests/quant/rule_triggers_test.cc Mxfp4Config.TargetedDenseModuleIsAnUnquantizedTarget"},
    {"undeclared-quantization", K::kContract,
     "packed FP4 tensors in a checkpoint without quantization_config",
     "own: a loader would read them as dense weights (docs/formats.md §2)",
     "mini-kimi-mxfp4 without quantization_config",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.PackedTensorsWithoutQuantizationConfigAreUndeclared"},
    {"unsupported-format", K::kContract,
     "a quant_method/format pair this tool does not check",
     "own: never guess a layout (docs/formats.md §4)",
     "mini-kimi-mxfp4 with quant_method bitsandbytes",
     "tests/quant/rule_triggers_test.cc Mxfp4Config.UnknownQuantMethodIsUnsupportedNeverGuessed"},
    {"layout", K::kContract,
     "an X4T quant_method on a root that is not a manifest.json + tensors/ container",
     "own: docs/formats.md §6", "mini-kimi-mxfp4 with quant_method kimi_x4t",
     "tests/quant/rule_triggers_test.cc Mxfp4Config.X4TMethodOnAPlainCheckpointIsALayoutFinding"},
    {"tensor-contract", K::kContract,
     "an X4T container B module whose tensors do not resolve to one weight",
     "own: docs/formats.md §6", "mini-kimi-x4t with one exceptions stream declared I32",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TModulesThatDoNotResolveOrWhoseFixedStreamIsMisSizedAreNamed"},
    {"x4t-fixed-size", K::kContract,
     "an X4T fixed scale stream whose size disagrees with the packed weight's geometry",
     "own: docs/formats.md §6", "mini-kimi-x4t with one weight_packed re-declared [96, 128]",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TModulesThatDoNotResolveOrWhoseFixedStreamIsMisSizedAreNamed"},
    {"format-version", K::kContract, "X4T quantization_config format_version is not 1",
     "own: docs/formats.md §6", "mini-kimi-x4t with format_version 2",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TVersionRootSchemaAndContractCodecAreChecked"},
    {"checkpoint-root", K::kContract, "X4T checkpoint_root is not an absolute path",
     "own: docs/formats.md §6", "mini-kimi-x4t with a relative checkpoint_root",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TVersionRootSchemaAndContractCodecAreChecked"},
    {"checkpoint-root-mismatch", K::kContract,
     "X4T checkpoint_root is not the mounted root (after --map-root)",
     "own: a server would read another directory's tensors (docs/formats.md §6)",
     "mini-kimi-x4t (declares /x4t) without --map-root",
     "tests/quant/format_test.cc Format.X4TCheckpointRootMustBeTheMountedRootUnlessMapped"},
    {"manifest-schema", K::kContract, "X4T manifest.json schema is not the expected one",
     "own: docs/formats.md §6", "mini-kimi-x4t with manifest.json schema edited",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TVersionRootSchemaAndContractCodecAreChecked"},
    {"manifest-codec", K::kContract, "X4T manifest.json codec is not the scale codec",
     "own: docs/formats.md §6", "mini-kimi-x4t with manifest.json codec edited",
     "tests/quant/format_test.cc Format.X4TManifestAndNestedConfigAreChecked"},
    {"manifest-family", K::kContract,
     "X4T manifest.json family does not match quant_method (kimi_k3 / deepseek_v41)",
     "own: docs/formats.md §6", "mini-kimi-x4t with manifest.json family edited",
     "tests/quant/format_test.cc Format.X4TManifestAndNestedConfigAreChecked"},
    {"build-contract-schema", K::kContract,
     "X4T build-contract.json schema is not the expected one",
     "own: docs/formats.md §6", "mini-kimi-x4t with build-contract.json edited",
     "tests/quant/format_test.cc Format.X4TManifestAndNestedConfigAreChecked"},
    {"build-contract-codec", K::kContract, "X4T build-contract.json codec is not the scale codec",
     "own: docs/formats.md §6", "mini-kimi-x4t with build-contract.json codec edited",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.X4TVersionRootSchemaAndContractCodecAreChecked"},
    {"build-contract-family", K::kContract,
     "X4T build-contract.json family does not match quant_method",
     "own: docs/formats.md §6", "mini-kimi-x4t with build-contract.json edited",
     "tests/quant/format_test.cc Format.X4TManifestAndNestedConfigAreChecked"},
    {"sidecar-metadata", K::kContract,
     "an X4T container A sidecar whose metadata is not the layer schema it must be",
     "own: docs/formats.md §6", "an X4T sidecar written from mini-kimi-mxfp4, metadata edited",
     "tests/quant/x4t_sidecar_test.cc X4TSidecar.ContractBreaksAreNamed"},
    {"sidecar-geometry", K::kContract,
     "an X4T sidecar's layer, experts or matrix shapes disagree with config.json",
     "own: docs/formats.md §6", "an X4T sidecar written from mini-kimi-mxfp4, experts edited",
     "tests/quant/x4t_sidecar_test.cc X4TSidecar.ContractBreaksAreNamed"},
    {"sidecar-tensor", K::kContract,
     "an X4T sidecar tensor missing, mis-shaped or not decoding canonically",
     "own: docs/formats.md §6",
     "an X4T sidecar written from mini-kimi-mxfp4, w3.packed dropped, expert_ids U32, w1's "
     "exception offsets past the stream",
     "tests/quant/x4t_sidecar_test.cc "
     "X4TSidecar.TensorsThatAreMissingMisTypedOrDoNotDecodeAreNamed"},
    {"sidecar-unreadable", K::kContract,
     "an x4t-layer-*.safetensors file the strict reader refuses",
     "own: docs/formats.md §1, §6", "mini-kimi-mxfp4 with a 3-byte x4t-layer-00001.safetensors",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.UnreadableX4TSidecarIsNamed"},

    {"unsupported-quant-algo", K::kContract,
     "a ModelOpt quant_algo (or a MIXED_PRECISION entry's) other than NVFP4 / W4A16_NVFP4",
     "own: vLLM serves only the algos it lists (docs/formats.md §9.1)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) with quant_algo FP8",
     "tests/quant/modelopt_test.cc ModelOptDetect.BadConfigsAreNamedFindings"},
    {"config-field-missing", K::kContract,
     "hf_quant_config.json lacks group_size / kv_cache_quant_algo / exclude_modules, or "
     "MIXED_PRECISION lacks quantized_layers",
     "own: vLLM refuses such an NVFP4 config with ValueError (docs/formats.md §9.1)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) without group_size",
     "tests/quant/modelopt_test.cc ModelOptDetect.BadConfigsAreNamedFindings"},
    {"config-unreadable", K::kContract,
     "hf_quant_config.json does not parse, or is not from ModelOpt",
     "own: a config that cannot be read cannot say what the tensors are (docs/formats.md §9.1)",
     "mini-kimi-nvfp4 converted to ModelOpt, hf_quant_config.json cut short",
     "tests/quant/modelopt_test.cc ModelOptDetect.BadConfigsAreNamedFindings"},
    {"alias-collision", K::kContract,
     "two alias spellings of one module (language_model.model. / model. / block_sparse_moe <-> "
     "mlp) carry different MIXED_PRECISION entries",
     "NVIDIA/Model-Optimizer#2206",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h), MIXED_PRECISION "
     "with conflicting alias entries",
     "tests/quant/modelopt_test.cc ModelOptDetect.MixedPrecisionFindings"},
    {"alias-ambiguous", K::kContract,
     "one alias spelling in a MIXED_PRECISION manifest names two stored modules",
     "NVIDIA/Model-Optimizer#2206",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h), K3 MIXED_PRECISION, "
     "a dense model.layers.1...experts.0.w1 stored beside the quantized one",
     "tests/quant/modelopt_test.cc ModelOptDetect.SpellingThatNamesTwoStoredModulesIsAmbiguous"},
    {"quantized-layer-absent", K::kContract,
     "a MIXED_PRECISION quantized_layers key names no stored module",
     "own: a manifest entry that matches nothing quantizes nothing (docs/formats.md §9.7)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h), MIXED_PRECISION "
     "with an extra entry",
     "tests/quant/modelopt_test.cc ModelOptDetect.MixedPrecisionFindings"},
    {"quantized-unlisted", K::kContract,
     "a quantized module missing from MIXED_PRECISION quantized_layers",
     "own: a loader treats an unlisted module as unquantized (docs/formats.md §9.7)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h), MIXED_PRECISION "
     "missing one module",
     "tests/quant/modelopt_test.cc ModelOptDetect.MixedPrecisionFindings"},
    {"exclude-matches-nothing", K::kContract,
     "an exclude_modules / ignore pattern that matches no module under any spelling",
     "own: a stale pattern hides what it was meant to exclude (docs/formats.md §9.2)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) with an extra "
     "exclude pattern",
     "tests/quant/modelopt_test.cc ModelOptPair.StaleExcludePatternIsAWarningNotAMismatch",
     /*warning=*/true},
    {"w13-missing-global-scale", K::kContract,
     "w1 or w3 lacks weight_scale_2 while its sibling has one: vLLM loads both with w1's",
     "vllm-project/vllm#54150",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) without one w3 "
     "weight_scale_2",
     "tests/quant/modelopt_test.cc ModelOptContract.WeightScale2ShapeAndCompleteness"},
    {"missing-input-scale", K::kContract,
     "a W4A4 ModelOpt module without its input_scale",
     "vllm-project/vllm#45212",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) without one "
     "input_scale",
     "tests/quant/modelopt_test.cc ModelOptContract.WeightScale2ShapeAndCompleteness"},
    // The scale-window policy (docs/quant.md "Scale-window policy").
    {"over-span", K::kScaleWindow,
     "an active MXFP4 group with k_max - k > 17: no NVFP4 block scale holds it exactly",
     "NVIDIA/Model-Optimizer#1372 (1,214 out-of-range gpt-oss-120b blocks cast lossily)",
     "mini-kimi-mxfp4 with one active group's scale byte set to 100",
     "tests/quant/scale_window_test.cc ScaleWindow.OverSpanGroupIsListedWithCoordinates"},
    {"nan-scale", K::kScaleWindow, "E8M0 0xFF (NaN) on a group with nonzero codes",
     "own: OCP MX v1.0 makes 0xFF NaN; gpt-oss and transformers decode it as 2^128",
     "mini-kimi-mxfp4 with one active group's scale set to 0xFF",
     "tests/quant/scale_window_test.cc ScaleWindow.NaNScaleOnActiveGroupIsRejectedAndReported"},
    {"nan-scale-zero-group", K::kScaleWindow,
     "E8M0 0xFF on an all-zero group: reported, the values are zero whatever the scale",
     "own: OCP MX v1.0 makes 0xFF NaN (docs/formats.md §3)",
     "mini-kimi-mxfp4 with 0xFF on an all-zero group's scale",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.NaNScaleOnAnAllZeroGroupIsReportedNotRejected"},

    // Backend hazards (never change a verdict).
    {"vllm-w13-global-scale-collapse", K::kHazard,
     "NVFP4 w1/w3 (or a routed expert's gate/up_proj) global scales differ: vLLM loads w3 "
     "with w1's global scale",
     "vllm-project/vllm#54150",
     "mini-kimi-nvfp4 with one expert's w3 global scale doubled",
     "tests/quant/scale_window_test.cc ScaleWindow.Nvfp4FixtureHasNoHazardsUntilW13GlobalsDiffer"},
    {"vllm-fused-global-scale-max", K::kHazard,
     "global scales of a fused dense q/k/v or gate/up linear differ: vLLM takes their max",
     "own: vLLM's fused NVFP4 linears use the max without rescaling (docs/formats.md §5)",
     "mini-kimi-nvfp4's expert 0 w1/w3 stored as layer 0's dense gate_proj/up_proj, up's global "
     "doubled",
     "tests/quant/rule_triggers_test.cc "
     "RuleTriggers.DenseGateUpWithDifferentGlobalsIsTheFusedMaxHazard"},
    {"marlin-small-scale-folding", K::kHazard,
     "a span >= 15 or an NVFP4 block scale below 2^-6, which Marlin's scale folding may round",
     "own: vLLM marlin_utils_fp4.py scale folding, unverified on a GPU (docs/formats.md §5)",
     "mini-kimi-mxfp4 with one active group's scale byte set to 100",
     "tests/quant/scale_window_test.cc ScaleWindow.OverSpanGroupIsListedWithCoordinates"},

    {"zero-block-scale", K::kHazard,
     "an E4M3 block scale of +-0 on a block with nonzero codes: its values read as zero",
     "own: ModelOpt never writes one, vLLM does not check (docs/formats.md §9.3)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) with one active "
     "block scale zeroed",
     "tests/quant/modelopt_test.cc ModelOptHazards.BlockScalesAndScalarsGiveNamedFindings"},
    {"bad-global-scale", K::kHazard,
     "a per-tensor weight global of zero, negative, NaN or infinite",
     "own: vLLM checks none of this (docs/formats.md §9.3)",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) with weight_scale_2 "
     "NaN",
     "tests/quant/modelopt_test.cc ModelOptHazards.BlockScalesAndScalarsGiveNamedFindings"},
    {"bad-input-scale", K::kHazard,
     "an input_scale / input_global_scale of zero, negative, NaN or infinite",
     "vllm-project/vllm#45212",
     "mini-kimi-nvfp4 converted to ModelOpt (tests/quant/modelopt_fixture.h) with input_scale 0",
     "tests/quant/modelopt_test.cc ModelOptHazards.BlockScalesAndScalarsGiveNamedFindings"},
    // Pair verification (docs/quant.md "Pair verification").
    {"packed-bytes-differ", K::kPair, "a 32-group's FP4 codes differ between source and derived",
     "own: a lossless transcode copies every code (docs/formats.md §5)",
     "mini-kimi-nvfp4 with one packed byte flipped",
     "tests/quant/pair_verify_test.cc PairVerify.FlippedNibbleIsAPackedAndValueMismatch"},
    {"value-differs", K::kPair, "a reconstructed value of a 32-group differs from the source's",
     "own: docs/formats.md §5",
     "mini-kimi-nvfp4 with one block scale doubled (+8 in E4M3)",
     "tests/quant/pair_verify_test.cc PairVerify.ScaleOffByAPowerOfTwoIsAValueMismatch"},
    {"scale-differs", K::kPair, "a decoded X4T scale differs from the source's E8M0 byte",
     "own: docs/formats.md §6", "mini-kimi-x4t with a fixed scale stream byte changed",
     "tests/quant/pair_verify_test.cc PairVerify.CorruptX4TScaleStreamAndListingCap"},
    {"x4t-stream-invalid", K::kPair, "a derived X4T scale stream that does not decode canonically",
     "own: docs/formats.md §6", "mini-kimi-x4t with a fixed scale stream byte changed",
     "tests/quant/pair_verify_test.cc PairVerify.CorruptX4TScaleStreamAndListingCap"},
    {"derived-tensor-invalid", K::kPair,
     "a derived quantized tensor that cannot be read as its kind",
     "own: docs/formats.md §4, §6", "mini-kimi-x4t with a group-major w2 left undeclared",
     "tests/quant/x4t_codec_test.cc X4TContainer.UndeclaredGroupMajorW2IsAMismatch"},
    {"shape-differs", K::kPair, "a derived quantized tensor's shape differs from the source's",
     "own: docs/formats.md §5", "mini-kimi-nvfp4 with expert 0 w1 re-declared [96, 256]",
     "tests/quant/rule_triggers_test.cc RuleTriggers.DerivedMatrixOfAnotherShapeIsShapeDiffers"},
    {"derived-kind", K::kPair,
     "a derived module that is neither NVFP4 nor X4T where the source is MXFP4",
     "own: docs/formats.md §5", "mini-kimi-nvfp4 with expert 3's w1 left as the MXFP4 source's",
     "tests/quant/rule_triggers_test.cc RuleTriggers.DerivedModuleLeftMxfp4IsADerivedKindMismatch"},
    {"ignored-tensor-differs", K::kPair,
     "a non-quantized tensor differs (dtype, shape or SHA-256) between source and derived",
     "own: a transcode must carry dense tensors bit-identical (docs/formats.md §5)",
     "mini-kimi-nvfp4 with one q_proj byte changed",
     "tests/quant/pair_verify_test.cc PairVerify.ChangedDenseTensorIsReportedByDigest"},
    {"fused-global-scale-differs", K::kPair,
     "derived fused w1/w3 (gate/up, q/k/v) global scales differ",
     "vllm-project/vllm#54150",
     "mini-kimi-nvfp4 with one expert's w3 global and block scales halved",
     "tests/quant/pair_verify_test.cc PairVerify.W13GlobalScalesDifferingIsAMismatch"},

    {"zero-group-scale-sets-kmax", K::kHazard,
     "all-zero source groups carry E8M0 bytes above every active group's, so ModelOpt's k_max "
     "takes them",
     "NVIDIA/Model-Optimizer#1372",
     "mini-kimi-mxfp4 (experts 0/5/10/15) against its ModelOpt conversion",
     "tests/quant/modelopt_test.cc ModelOptPair.ConvertedFixtureIsLosslessAgainstItsMxfp4Source"},
    {"modelopt-kmax-lossy-blocks", K::kHazard,
     "source blocks outside ModelOpt's k_max - k <= 17 window, which its cast would requantize",
     "NVIDIA/Model-Optimizer#1372",
     "mini-kimi-mxfp4 against its ModelOpt conversion",
     "tests/quant/modelopt_test.cc ModelOptPair.ConvertedFixtureIsLosslessAgainstItsMxfp4Source"},
    {"fused-kmax-not-shared", K::kHazard,
     "source w1/w3 k_max differ under ModelOpt's rule and the derived w1/w3 globals differ: the "
     "cast did not share k_max",
     "vllm-project/vllm#54150",
     "mini-kimi-mxfp4 and a ModelOpt conversion with w3's global changed",
     "tests/quant/modelopt_test.cc ModelOptPair.FusedKmaxNotSharedIsAHazard"},
    // The audit's own checks (docs/audit-engine.md, docs/forward.md).
    {"unchecked-weights-file", K::kAudit,
     "a weight-like file no check read and no common loader reads by default (listed only)",
     "own: evidence must say what it did not cover",
     "mini-kimi-mxfp4 with a shard copied into a subfolder",
     "tests/audit/weight_files_test.cc "
     "WeightFilesTest.SubfolderWeightsAndTrainingStateAreListedUncheckedWithoutFailing"},
    {"unindexed-weights-file", K::kAudit,
     "a root-level .safetensors file the index does not list, which some loaders still read",
     "own: a loader may serve weights the audit never read",
     "mini-kimi-mxfp4 with model.safetensors beside the index",
     "tests/audit/weight_files_test.cc "
     "WeightFilesTest.UnindexedModelSafetensorsBesideTheIndexFailsTheAudit"},
    {"unsupported-weights-file", K::kAudit,
     "a root-level weights format a loader reads by default (.bin, .pt, .gguf) and no check reads",
     "own: a loader may serve weights the audit never read",
     "mini-kimi-mxfp4 with pytorch_model.bin at the root",
     "tests/audit/weight_files_test.cc WeightFilesTest.PytorchModelBinAtTheRootFailsTheAudit"},
    {"block-output-differs", K::kAudit,
     "the derived checkpoint's reference block forward differs from the source's",
     "own: docs/formats.md §7", "mini-kimi-nvfp4 with a packed byte and a block scale flipped",
     "tests/audit/record_golden_test.cc RecordGoldenTest.PairWithFlippedCodeAndScale"},
    {"vllm-w13-collapse-output-differs", K::kAudit,
     "the block forward loaded as vLLM does (w1's global for w3) differs from the source's",
     "vllm-project/vllm#54150",
     "mini-kimi-nvfp4 with every layer-1 w3 global and block scale halved (lossless, globals "
     "differ)",
     "tests/forward/forward_audit_test.cc ModelForward.VllmW13CollapseEmulation"},

    // Hugging Face cache and download layouts (docs/hf-layouts.md).
    {"link-not-to-blob", K::kLayout, "a snapshot link that does not point into blobs/",
     "own: docs/hf-layouts.md", "hub snapshot of mini-kimi-mxfp4 with a link into another snapshot",
     "tests/core/hf_layout_test.cc "
     "HubSnapshotTest.LinkOutsideBlobsAndUnnamedBlobAreReportedNotFailing"},
    {"blob-name-unchecked", K::kLayout, "a blob named by neither a SHA-256 nor a git blob id",
     "own: docs/hf-layouts.md", "hub snapshot of mini-kimi-mxfp4 with a blob named not-a-digest",
     "tests/core/hf_layout_test.cc "
     "HubSnapshotTest.LinkOutsideBlobsAndUnnamedBlobAreReportedNotFailing"},
    {"blob-digest-mismatch", K::kLayout, "a blob's content does not match its digest name",
     "own: a corrupted or tampered cache (docs/hf-layouts.md)",
     "hub snapshot of mini-kimi-mxfp4 with a blob byte flipped",
     "tests/core/hf_layout_test.cc HubSnapshotTest.TamperedBlobsAreFlagged"},
    {"no-download-metadata", K::kLayout, "a file of a local download without .metadata",
     "own: not part of the download, or added after it (docs/hf-layouts.md)",
     "local download of mini-kimi-nvfp4 with one .metadata removed",
     "tests/core/hf_layout_test.cc LocalDirTest.MixedCommitsFlaggedAndMissingMetadataReported"},
    {"download-metadata-unreadable", K::kLayout, "a .metadata file that cannot be parsed",
     "own: docs/hf-layouts.md", "local download of mini-kimi-nvfp4 with a one-line .metadata",
     "tests/core/hf_layout_test.cc "
     "LocalDirTest.UnreadableMetadataAndUncheckableEtagAreReportedNotFailing"},
    {"etag-unchecked", K::kLayout, "an etag that is neither a SHA-256 nor a git blob id",
     "own: docs/hf-layouts.md", "local download of mini-kimi-nvfp4 with etag not-a-digest",
     "tests/core/hf_layout_test.cc "
     "LocalDirTest.UnreadableMetadataAndUncheckableEtagAreReportedNotFailing"},
    {"etag-mismatch", K::kLayout, "a downloaded file's digest differs from its recorded etag",
     "own: changed since download, or corrupted (docs/hf-layouts.md)",
     "local download of mini-kimi-nvfp4 with a shard byte flipped",
     "tests/core/hf_layout_test.cc LocalDirTest.EtagMismatchIsFlagged"},
    {"mixed-commits", K::kLayout, "a local download whose files come from more than one commit",
     "own: no one revision describes the files (docs/hf-layouts.md)",
     "local download of mini-kimi-nvfp4 with one .metadata naming another commit",
     "tests/core/hf_layout_test.cc LocalDirTest.MixedCommitsFlaggedAndMissingMetadataReported"},
};

}  // namespace

std::span<const Rule> Rules() { return kRules; }

const Rule* FindRule(std::string_view id) {
  for (const Rule& r : kRules) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

std::string_view RuleKindName(RuleKind kind) {
  switch (kind) {
    case RuleKind::kContract: return "contract";
    case RuleKind::kScaleWindow: return "scale-window";
    case RuleKind::kHazard: return "hazard";
    case RuleKind::kPair: return "pair";
    case RuleKind::kAudit: return "audit";
    case RuleKind::kLayout: return "layout";
  }
  return "unknown";
}

}  // namespace ckpt::quant
