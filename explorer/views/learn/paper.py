"""What the three papers report, quoted for the Learn page to show beside our numbers.

These are the papers' published results (text, figures and tables), not ours: every number the
page computes comes from the engine through the service.
"""

#: OptCNN (Jia et al., ICML 2018)
OPTCNN = {
    "fig1": "Figure 1: Conv8 of VGG-16 on 4 GPUs - parallelizing in the sample dimension "
            "(data parallelism) is suboptimal; other dimensions (and their combinations) give "
            "the same output faster, at the price of devices sharing some input data.",
    "table1": [("Fully-connected", "sample, channel"),
               ("1D convolution / pooling", "sample, channel, length"),
               ("2D convolution / pooling", "sample, channel, height, width"),
               ("3D convolution / pooling", "sample, channel, height, width, depth")],
    "fig2": "Figure 2 / §3: the first fully-connected layer of VGG-16 on 2 GPUs - parallelism "
            "in the channel dimension removes parameter synchronisation but transfers the "
            "input tensor: it reduces communication by 12× against data parallelism.",
    "fig2_ratio": 12.0,
    "table3_k": 2,   # nodes in the final graph for every network (Table 3 caption)
    "speedup16": {"alexnet": (12.2, 6.1), "vgg16": (14.8, 10.2), "inception_v3": (15.5, 11.2)},
    "fig8": "Figure 8: OWT reduces communication 1.1-23.0× against data and model parallelism; "
            "layer-wise parallelism reduces it a further 1.2-2.5× against OWT.",
    # Table 5: VGG-16 on 4 GPUs of one node
    "table5": [("2 × Conv + Pooling", "n=4"), ("2 × Conv + Pooling", "n=4"),
               ("3 × Conv + Pooling", "n=4"), ("3 × Conv + Pooling", "n=4"),
               ("3 × Conv + Pooling", "h=2, w=2"), ("Fully-connected", "c=4"),
               ("Fully-connected", "c=4"), ("Fully-connected", "c=2"),
               ("Softmax", "n=1, c=1")],
}

#: Tofu (Wang et al., EuroSys 2019)
TOFU = {
    "fig2": [("Figure 2(a): partition the batch b", "each worker reads half of data and the "
              "whole filters; the output is the concatenation of the workers' slices"),
             ("Figure 2(b): partition the reduction ci", "each worker reads half of data and "
              "half of filters; the output is the sum of the workers' outputs (output "
              "reduction, which ICML18 ignores)")],
    "fig10": [("AllRow-Greedy", "worst of all; out of memory on WResNet-152-10"),
              ("Spartan, EqualChop", "3-10% less communication overhead than AllRow-Greedy, "
               "still slower than Tofu"),
              ("ICML18", "7% slower than Tofu on RNN-4-8K; out of memory on WResNet-152-10 "
               "(no output reduction)"),
              ("Tofu", "fastest; 8 GPUs, RNN-4-8K batch 512, WResNet-152-10 batch 8")],
    "fig6": "Figure 6 / §5.2: to partition for k = 2^m workers, Tofu runs its dynamic program "
            "for two worker groups, then again inside each group, m times; each step "
            "partitions every tensor along one dimension and applies the first group's "
            "choice to all groups. A matrix cut by row, then by column, ends in a 2×2 grid; "
            "data one group fetched at step i is an extra input at step i + 1.",
    "table1": [("Original DP (Jia et al.)", "n/a", "n/a"),
               ("DP with coarsening", "8 hours", "> 24 hours"),
               ("Using recursion", "8.3 seconds", "66.6 seconds")],
    "theorem": "Appendix A: the steps' costs are commutative, so the greedy sequence of "
               "per-step optima is no worse than the optimal sequence (Theorem 4: steps "
               "that move fewer bytes come first, suited to slower links at the top of a "
               "hierarchy).",
    "fig11": "Figure 11: Tofu's partition of WResNet-152-10 on 8 GPUs - weights (top) and "
             "activations (bottom) of the convolutions, one colour per GPU; most convolutions "
             "are not partitioned by the batch alone.",
}

#: Celeritas (Table 3: step time in seconds on 4 V100; Table 4: placement time in seconds)
CELERITAS = {
    "fig2": "Figure 2: Standard Evaluation acquires the graph's node and edge information; "
            "Celeritas coarsens the graph by merging CPD-TOPO-ordered nodes; Adjusting "
            "Placement allocates the coarse graph's nodes; the placement maps back to the "
            "original operators.",
    #: Table 2: nodes and CCR before and after Optimal Operation Fusion
    "table2": [("Inception_V3", "6332", "33.118", "59", "8.137"),
               ("NMT", "25463", "18.630", "154", "6.372"),
               ("Transformer", "36352", "111.957", "220", "11.10"),
               ("Tensor Holography", "3810", "49.147", "37", "7.438")],
    "fig3": "Figure 3: placing the example on two devices in M-TOPO order cuts 4 edges; "
            "DFS-TOPO order cuts none.",
    "fig3_cuts": {"M-TOPO": 4, "DFS-TOPO": 0},
    "table3_columns": ("Metis", "m-TOPO", "m-ETF", "m-SCT", "HRL", "Order-Place", "Celeritas"),
    "table3": {"Inception_V3": ("OOM", "3.100", "10.548", "7.610", "8.565", "2.931", "2.859"),
               "NMT": ("OOM", "OOM", "OOM", "OOM", "10.224", "9.117", "9.099"),
               "Transformer": ("OOM", "OOM", "8.613", "8.411", "42.837", "6.935", "6.536"),
               "Tensor Holography": ("6.591", "2.220", "6.376", "6.013", "3.683", "1.520",
                                     "1.461")},
    "table4_columns": ("m-SCT", "HRL", "Order-Place", "Celeritas"),
    "table4": {"Inception_V3": ("8.591", "5 hrs", "5.439", "7.183"),
               "NMT": ("-", "5 hrs", "54.695", "59.418"),
               "Transformer": ("129.498", "5 hrs", "92.639", "95.304"),
               "Tensor Holography": ("2.968", "5 hrs", "2.711", "3.586")},
}
