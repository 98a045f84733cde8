import torch, numpy as np, torch.nn.functional as F
torch.manual_seed(0); dev="cuda"
for causal in (False, True):
    lengths=[7,130,1,300,64,129]; T=sum(lengths); H=32; D=64
    q,k,v,do=(torch.randn(T,H,D,device=dev,dtype=torch.bfloat16) for _ in range(4))
    cu=torch.tensor(np.concatenate([[0],np.cumsum(lengths)]),dtype=torch.int32,device=dev)
    def run(fn, dt, a, b, c, g):
        a,b,c=(x.detach().to(dt).requires_grad_() for x in (a,b,c)); o=fn(a,b,c); o.backward(g.to(dt)); return o,a.grad,b.grad,c.grad
    def ragged(a,b,c): return torch.ops.aten._cudnn_attention_forward(a,b,c,None,cu,cu,max(lengths),max(lengths),True,0.0,causal,False)[0]
    def ref(a,b,c):
        outs=[];s=0
        for n in lengths:
            outs.append(F.scaled_dot_product_attention(*(x[s:s+n].transpose(0,1) for x in (a,b,c)),is_causal=causal).transpose(0,1)); s+=n
        return torch.cat(outs)
    got=run(ragged,torch.bfloat16,q,k,v,do); want=run(ref,torch.float32,q,k,v,do)
    print("causal" if causal else "bidirectional", "MHA 32 heads, cuDNN", torch.backends.cudnn.version(), {n:(round(float((g.float()-w).abs().max()),4), round(float(w.abs().max()),2)) for n,g,w in zip(("out","dq","dk","dv"),got,want)})
